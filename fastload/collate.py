"""Samples → one uint8 N×H×W×C batch, allocated once where it will be consumed.

A multi-view sample (a tuple of images) makes a tuple of batches, one per view
(:mod:`fastload.views`).

No float conversion and no transpose here: both happen where normalization happens
(on the GPU, or fused in the CPU path of the prefetcher), so the CPU moves a quarter
of the bytes a float32 batch would take.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import get_worker_info

from .batch import is_namedtuple
from .views import SampleShape, is_views, numpy_rows, row, shape_of

SHM = "/dev/shm"


class SharedMemoryFull(RuntimeError):
    """/dev/shm cannot hold a batch that a worker process sends through it."""


def shm_full_message(nbytes: int, workers: int) -> str:
    """What a worker says when /dev/shm cannot hold its next batch of ``nbytes``: the size, the
    need, and the fixes (torch's own error names only a file)."""
    try:
        st = os.statvfs(SHM)
        size, free = st.f_blocks * st.f_frsize / 2**20, st.f_bavail * st.f_frsize / 2**20
        where = f"{SHM} ({size:.0f} MB, {free:.0f} MB free)"
    except OSError:
        where = SHM
    return (
        f"fastload: {where} cannot hold the next batch ({nbytes / 2**20:.1f} MB): this Loader's {workers} "
        f"worker process(es) each keep up to prefetch_factor + 1 batches there, about "
        f"{workers * 3 * nbytes / 2**20:.0f} MB with the default prefetch_factor=2. Fixes: give the container "
        'more shared memory (docker run --shm-size=2g, or --ipc=host), use backend="thread" (no shared '
        "memory), or a smaller batch_size or prefetch_factor."
    )


def alloc_batch(shape: Sequence[int], dtype: torch.dtype = torch.uint8, pin: bool | None = None) -> torch.Tensor:
    """An uninitialised tensor placed where the batch goes next.

    In a DataLoader worker: shared memory, so sending it to the main process copies
    nothing. In the main process: pinned memory when ``pin`` (default: CUDA is
    available), so the host-to-device copy can be asynchronous.
    """
    shape = tuple(int(s) for s in shape)
    info = get_worker_info()
    if info is not None:
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        try:
            storage = torch.UntypedStorage._new_shared(nbytes)
        except RuntimeError as e:
            if "No space left on device" not in str(e):
                raise
            raise SharedMemoryFull(shm_full_message(nbytes, info.num_workers)) from None
        return torch.empty(0, dtype=dtype).set_(storage).view(shape)
    if pin is None:
        pin = torch.cuda.is_available()
    if pin:
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    # numpy asks the kernel for huge pages on large arrays (madvise), which halves the
    # page-fault cost of first touching a fresh batch compared with torch.empty.
    return torch.from_numpy(np.empty(shape, dtype=torch.empty(0, dtype=dtype).numpy().dtype))


def pinning_on(device: Any) -> Any:
    """A context in which pinned memory is allocated for ``device`` (a CUDA torch.device, or
    None: no change). CUDA pins host memory in the current device's context: pinned from a
    thread whose current device is another GPU, it makes a context there (a DDP rank whose
    loader is built before ``set_device`` would put one on GPU 0)."""
    if device is None or torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def check_image(img: np.ndarray | tuple[np.ndarray, ...], where: str) -> None:
    """Raises TypeError unless ``img`` is a uint8 H×W×C array, or a non-empty tuple of them (views)."""
    if is_views(img) and len(img):
        for k, view in enumerate(img):
            check_image(view, f"{where}, view {k}")
        return
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3:
        desc = f"{type(img).__name__} {getattr(img, 'dtype', '')} {getattr(img, 'shape', '')}"
        raise TypeError(f"{where}: expected a uint8 H×W×C numpy array, got {desc}")


def write_row(row: np.ndarray | tuple[np.ndarray, ...], img: np.ndarray | tuple[np.ndarray, ...], where: str) -> int:
    """Copies ``img`` into its batch row unless it already is that row (a transform wrote
    it in place); returns the number of copies made (0 or 1; per view for views).

    Raises:
        TypeError: ``img`` is not a uint8 H×W×C array.
        ValueError: ``img`` does not have the row's shape.
    """
    if img is row:
        return 0
    if is_views(row):
        if not is_views(img) or len(img) != len(row):
            check_image(img, where)
            raise ValueError(
                f"{where} has shape {shape_of(img)} but the batch holds {shape_of(row)}; "
                "every sample must have the same views"
            )
        return sum(write_row(r, v, f"{where}, view {k}") for k, (r, v) in enumerate(zip(row, img)))
    dst = cast(np.ndarray, row)  # a single view from here on
    if is_views(img) or cast(np.ndarray, img).shape != dst.shape or cast(np.ndarray, img).dtype != np.uint8:
        check_image(img, where)
        raise ValueError(
            f"{where} has shape {shape_of(img)} but the batch holds {dst.shape}; "
            "use a transform with a fixed output size (e.g. RandomResizedCrop or CenterCrop)"
        )
    dst[...] = img  # the one copy per sample; handles flipped (negative-stride) views
    return 1


def batch_buffer(
    n: int,
    sample_shape: SampleShape,
    out: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
    pin: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The uint8 N×H×W×C tensor a batch of ``n`` samples of ``sample_shape`` is written into:
    the first ``n`` rows of ``out`` (a reused buffer), else a new one (see :func:`alloc_batch`).
    A multi-view ``sample_shape`` (one shape per view) gives a tuple of them, one per view.

    Raises:
        ValueError: ``out`` cannot hold the batch.
    """
    if sample_shape and isinstance(sample_shape[0], tuple):
        outs = out if out is not None else (None,) * len(sample_shape)
        if len(outs) != len(sample_shape):
            raise ValueError(f"out holds {len(outs)} views, the batch {len(sample_shape)}")
        return tuple(cast(torch.Tensor, batch_buffer(n, s, o, pin)) for s, o in zip(sample_shape, outs))
    shape = (n, *(int(s) for s in cast(tuple[int, ...], sample_shape)))
    if out is None:
        return alloc_batch(shape, pin=pin)
    out = cast(torch.Tensor, out)  # a single view from here on
    if out.dtype != torch.uint8 or tuple(out.shape[1:]) != shape[1:] or out.shape[0] < n:
        raise ValueError(f"out buffer {tuple(out.shape)} {out.dtype} cannot hold a {shape} uint8 batch")
    return out[:n]


def fast_collate(
    samples: Sequence[tuple[np.ndarray, int]], pin: bool | None = None, out: torch.Tensor | None = None
) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]:
    """Stacks (HWC uint8 image, label) pairs into (N×H×W×C uint8, N int64); samples of
    several views (tuples of images) into (a tuple of N×H×W×C uint8, one per view, N int64).

    Args:
        samples: (image, label) pairs, images (or views) all of one shape.
        pin: Pin a newly allocated batch (default: when CUDA is available).
        out: A reusable uint8 buffer of at least N×H×W×C; the batch is a view of it.

    Raises:
        ValueError: The batch is empty or its images differ in shape.
        TypeError: An image is not a uint8 H×W×C array.
    """
    if len(samples) == 0:
        raise ValueError("fast_collate got an empty batch")
    first = samples[0][0]
    check_image(first, "fast_collate sample 0")
    images = batch_buffer(len(samples), shape_of(first), out, pin)
    rows = numpy_rows(images)
    for i, (img, _) in enumerate(samples):
        write_row(row(rows, i), img, f"fast_collate sample {i}")
    # Pinned like the images: a pageable labels copy would wait for the device's stream.
    labels = alloc_batch((len(samples),), torch.int64, pin=pin)
    labels.numpy()[:] = np.fromiter((label for _, label in samples), dtype=np.int64, count=len(samples))
    return images, labels


def collate_extras(fields: Sequence[tuple]) -> tuple:
    """The further fields of a batch's samples (after image and target), batched field by field
    as DataLoader's ``default_collate`` batches them: strings, bytes and paths as the samples'
    values (a tuple for a field of a tuple item, a list for a dict's key, as there);
    numbers as a tensor (Python ints int64, floats float64, bools bool; numpy scalars of
    their dtype, ``np.float32`` float32, ``np.int32`` int32); numpy
    arrays and tensors of one shape and dtype stacked; dicts of the same keys key by key;
    sequences of one length position by position (a namedtuple as its type, a list
    otherwise). Nothing is dropped: what does not batch so
    (None, ragged arrays, other objects) is handed out as the list of the samples' values.

    Args:
        fields: Each sample's further fields, all of the same number.

    Returns:
        One batched value per field.

    Raises:
        ValueError: The samples carry different numbers of fields.
    """
    if not fields or not fields[0]:
        return ()
    count = len(fields[0])
    if any(len(f) != count for f in fields):
        counts = sorted({len(f) for f in fields})
        raise ValueError(
            f"the samples of a batch carry different numbers of fields after (image, target): {counts}; "
            "return the same fields from every item"
        )
    return tuple(collate_values(tuple(f[k] for f in fields)) for k in range(count))


def collate_values(values: Sequence) -> Any:
    """``values`` (one per sample) as one batched value: see :func:`collate_extras`."""
    first = values[0]
    if isinstance(first, (str, bytes, os.PathLike)):
        return values
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return torch.tensor([bool(v) for v in values])
    numbers = (int, float, np.integer, np.floating)
    if all(isinstance(v, (np.integer, np.floating)) for v in values):
        # numpy scalars keep their dtype, as default_collate keeps it (np.float32 -> float32).
        return torch.as_tensor(np.asarray(values))
    if all(isinstance(v, numbers) and not isinstance(v, (bool, np.bool_)) for v in values):
        if all(isinstance(v, (int, np.integer)) for v in values):
            return torch.tensor([int(v) for v in values], dtype=torch.int64)
        return torch.tensor([float(v) for v in values], dtype=torch.float64)
    if all(isinstance(v, (np.ndarray, torch.Tensor)) for v in values):
        tensors = [torch.as_tensor(v) if isinstance(v, np.ndarray) and v.dtype != object else v for v in values]
        if all(
            isinstance(t, torch.Tensor) and t.shape == tensors[0].shape and t.dtype == tensors[0].dtype for t in tensors
        ):
            return torch.stack(tensors)
        return list(values)
    if isinstance(first, dict) and all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
        return {k: collate_values([v[k] for v in values]) for k in first}
    if isinstance(first, (tuple, list)) and all(isinstance(v, (tuple, list)) and len(v) == len(first) for v in values):
        fields = [collate_values(tuple(v[k] for v in values)) for k in range(len(first))]
        if is_namedtuple(first) and all(type(v) is type(first) for v in values):
            return type(first)(*fields)  # a namedtuple stays one, field by field (default_collate's)
        return fields
    return list(values)
