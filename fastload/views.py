"""A batch's pixels: one uint8 tensor, or one per view when a transform makes several views.

A multi-view transform (:class:`fastload.transforms.MultiView`) returns a tuple of H×W×C
uint8 arrays per sample, the views possibly of different sizes, so its batch is a tuple
of N×H×W×C tensors, one per view: every stage between the transform and the device
(collate, the batch buffers, pinning, the copy, normalization) maps over that tuple with
the helpers here, and does exactly what it did before on a single tensor. On the device
the views are handed out as a list (as ``torch.utils.data.default_collate`` batches a
list of views).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union, cast

import numpy as np
import torch

#: A batch's pixels on the host: uint8 N×H×W×C, or a tuple of them (one per view).
Images = Union[torch.Tensor, tuple[torch.Tensor, ...]]

#: One sample's shape: (H, W, C), or a tuple of them (one per view).
SampleShape = Union[tuple[int, ...], tuple[tuple[int, ...], ...]]


def is_views(images: Any) -> bool:
    """Whether ``images`` (a sample or a batch) holds several views: a tuple or list of arrays."""
    return isinstance(images, (tuple, list))


def each(images: Any) -> tuple:
    """The views of ``images`` as a tuple (a single image or batch: a tuple of one)."""
    return tuple(images) if is_views(images) else (images,)


def map_images(fn: Callable[[Any], Any], images: Any) -> Any:
    """``fn`` applied to each view (a tuple back), or to ``images`` itself when single."""
    return tuple(fn(v) for v in images) if is_views(images) else fn(images)


def shape_of(image: Any) -> SampleShape:
    """The shape of a sample (or a batch row): ``image.shape``, or one shape per view."""
    if is_views(image):
        return tuple(tuple(v.shape) for v in image)
    return tuple(image.shape)


def of_views(shape: SampleShape) -> bool:
    """Whether ``shape`` (a sample's or a batch's) is one shape per view."""
    return bool(shape) and isinstance(shape[0], tuple)


def batch_shape(n: int, sample: SampleShape) -> SampleShape:
    """The shape of a batch of ``n`` samples of shape ``sample`` (one per view)."""
    if of_views(sample):
        return tuple((n, *s) for s in cast(tuple[tuple[int, ...], ...], sample))
    return (n, *cast(tuple[int, ...], sample))


def batch_len(images: Images) -> int:
    """Samples in a batch."""
    return int(each(images)[0].shape[0])


def nbytes(images: Images) -> int:
    """Bytes of a batch's pixels."""
    return sum(t.numel() * t.element_size() for t in each(images))


def shapes(shape: SampleShape) -> tuple[tuple[int, ...], ...]:
    """The per-view shapes of a (sample or batch) shape: a tuple of one when single."""
    if of_views(shape):
        return cast(tuple[tuple[int, ...], ...], tuple(shape))
    return (cast(tuple[int, ...], tuple(shape)),)


def numpy_rows(images: Images) -> Any:
    """The numpy view(s) of a host batch, rows written in place."""
    return map_images(lambda t: t.numpy(), images)


def from_numpy(rows: Any) -> Images:
    """The tensor(s) viewing numpy rows made by :func:`numpy_rows` or allocated as arrays."""
    return map_images(torch.from_numpy, rows)


def row(rows: Any, j: int) -> Any:
    """Row ``j`` of a batch (one array per view for a multi-view batch)."""
    return tuple(r[j] for r in rows) if is_views(rows) else rows[j]


def same_memory(a: Any, b: Any) -> bool:
    """Whether any view of ``a`` starts where the same view of ``b`` does (no copy was made)."""
    return any(x.data_ptr() == y.data_ptr() for x, y in zip(each(a), each(b)))


def contiguous(image: Any) -> Any:
    """A sample's image(s) made contiguous (a flip is a negative-stride view until collate)."""
    return map_images(np.ascontiguousarray, image)


def to_device(images: Images, device: torch.device, non_blocking: bool = False) -> Images:
    """``images`` (each view) copied to ``device`` (no copy when already there)."""
    return map_images(lambda t: t.to(device, non_blocking=non_blocking), images)
