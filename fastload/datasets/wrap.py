"""Any map-style dataset as a fastload dataset: its items converted to HWC uint8 + target.

``Loader(your_dataset)`` wraps a dataset that has no ``load()`` in :class:`WrappedDataset`.
Its ``__getitem__`` still decodes (PIL, torchvision transforms, ...) in the workers;
fastload then does the rest: collate into shared/pinned memory, sharding, epochs, the
device copy and normalization.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image

from ..batch import SampleError
from ..transforms import as_compose
from ..views import contiguous
from .base import HoldsPipeline, sample_name, sample_rng
from .protocols import Describes, LoadTraits

ACCEPTED = "a PIL image (converted to RGB), a uint8 numpy array (H×W×C or H×W) or a uint8 tensor (C×H×W or H×W×C)"
NO_TARGET = -1  # the target of an item that is a bare image
_UNSPLIT = object()  # an item's image field before it was found
CHANNELS = (1, 3, 4)
_IMAGE_KEYS = ("image", "img")
_TARGET_KEYS = ("label", "target", "labels", "targets")
_PATH_KEYS = ("path", "file", "filename", "image_path")


class SampleTypeError(TypeError, SampleError):
    """A TypeError that names its sample: the loader adds no second name."""

    def __init__(self, message: str, index: int | None = None, where: str | None = None) -> None:
        SampleError.__init__(self, message, index, where)


class SampleKeyError(KeyError, SampleError):
    """A KeyError that names its sample: the loader adds no second name."""

    def __init__(self, message: str, index: int | None = None, where: str | None = None) -> None:
        SampleError.__init__(self, message, index, where)


class ImageLayoutError(TypeError):
    """An image fastload does not take as it is: pixels not uint8 (``ToTensor()``'s floats), or
    a C×H×W numpy array."""


class ItemsNotImages(SampleTypeError):
    """No item this process loaded so far was an image, and this one is no image at all (not a
    damaged one: see :func:`_not_images`): for :class:`fastload.DataLoader`, whose dataset then runs as
    torch's DataLoader (see :attr:`WrappedDataset.first_item_decides`). Under
    ``on_error="skip"`` it is skipped as any sample's error is (a damaged item may come first)."""

    #: Whether the items are images fastload does not take as they are (:class:`ImageLayoutError`).
    images: ClassVar[bool] = False


class ImagesNotUint8(ItemsNotImages):
    """:class:`ItemsNotImages` of items that are images, but not uint8 H×W×C (floats, C×H×W)."""

    images = True


NOT_IMAGES = (
    "fastload's Loader batches images (its items' first field, or image_key=); for data that is not images, "
    "use torch.utils.data.DataLoader"
)


def _not_images(field: Any, error: Exception) -> type[ItemsNotImages] | None:
    """What the first item's unconverted image ``field`` (or ``_UNSPLIT``) says of the dataset
    when its conversion raised ``error``: images not uint8 H×W×C (:class:`ImagesNotUint8`), no
    images at all (:class:`ItemsNotImages`: numbers, strings, arrays of numbers, an item with
    no image field), or None: a damaged sample of images (a missing image, bytes that are not
    one, uint8 pixels of two dimensions or more in no image's shape)."""
    if isinstance(error, ImageLayoutError):
        return ImagesNotUint8
    return None if _damaged(field) else ItemsNotImages


def _damaged(field: Any) -> bool:
    if field is None or isinstance(field, (bytes, bytearray, memoryview)):
        return True
    if isinstance(field, (tuple, list)):  # views: damaged where one is
        return any(_damaged(view) for view in field)
    # uint8 pixels of a shape no image has (H×W×2); other numbers of 2 dimensions or more are data.
    if isinstance(field, np.ndarray):
        return field.dtype == np.uint8 and field.ndim >= 2
    if isinstance(field, torch.Tensor) and _rowless(field):
        return False  # data of another kind
    return isinstance(field, torch.Tensor) and field.dtype == torch.uint8 and field.ndim >= 2


def _rowless(t: torch.Tensor) -> bool:
    """A nested or sparse tensor: no pixels in rows (``.numpy()`` fails on it)."""
    return t.is_nested or t.layout != torch.strided


def _looks_like_an_image(shape: tuple) -> bool:
    """H×W, or H×W×C / C×H×W with 1, 3 or 4 channels: an image in another dtype or layout."""
    return len(shape) == 2 or (len(shape) == 3 and (shape[0] in CHANNELS or shape[2] in CHANNELS))


def views_of(image: Any, transformed: bool) -> np.ndarray | tuple[np.ndarray, ...]:
    """The image field as H×W×C uint8: one image, or (a tuple or list of images: the item's own
    views, as a self-supervised dataset gives them) a tuple of them, batched as views (one
    batch tensor each, as a ``MultiView`` transform's).

    Raises:
        TypeError: A field that is not an image (nor a sequence of them), or views with a
            ``transform=`` (which would see one view, not the sample).
    """
    if isinstance(image, (tuple, list)) and image:
        if transformed:
            raise TypeError(
                f"the image field holds {len(image)} views, and transform= takes one image: make "
                "the views in the dataset, or give it one image and transform=fl.transforms.MultiView([...])"
            )
        return tuple(to_hwc_uint8(view) for view in image)
    return to_hwc_uint8(image)


def to_hwc_uint8(image: Any) -> np.ndarray:
    """``image`` as an H×W×C uint8 array (a view where it can be); TypeError otherwise (advice
    for an image of another dtype or layout; for what is not an image, that it is not one)."""
    if isinstance(image, Image.Image):
        arr = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    elif isinstance(image, np.ndarray):
        arr = image
    elif isinstance(image, torch.Tensor):
        if _rowless(image):
            kind = "nested" if image.is_nested else str(image.layout).removeprefix("torch.")
            raise TypeError(f"the image field is a {kind} tensor, not an image: {NOT_IMAGES}; it takes {ACCEPTED}")
        arr = image.detach().cpu().numpy()
        if arr.ndim == 3 and arr.shape[0] in CHANNELS and arr.shape[2] not in CHANNELS:
            arr = arr.transpose(1, 2, 0)  # C×H×W, torch's layout
    else:
        raise TypeError(f"the image field is a {type(image).__name__}, not an image: {NOT_IMAGES}; it takes {ACCEPTED}")
    shape = tuple(getattr(image, "shape", arr.shape))
    if not _looks_like_an_image(shape):
        raise TypeError(
            f"the image field is a {arr.dtype} array of shape {shape}, not an image (H×W×C, C×H×W or H×W): {NOT_IMAGES}"
        )
    if arr.dtype != np.uint8:
        raise ImageLayoutError(
            f"the image is {arr.dtype} {shape}, not uint8; fastload takes "
            "uint8 pixels and normalizes them on the device: drop ToTensor()/Normalize() from the "
            "dataset's own transform (or give PILToTensor() / uint8 arrays)"
        )
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in CHANNELS:
        raise ImageLayoutError(
            f"image of shape {tuple(arr.shape)} is not H×W×C with 1, 3 or 4 channels "
            f"(a C×H×W numpy array? transpose it); fastload takes {ACCEPTED}"
        )
    return arr


def _pick(item: dict, key: Any, defaults: tuple[str, ...], what: str, option: str) -> Any:
    if key is not None:
        if key not in item:
            raise KeyError(f"the item has no {what} key {key!r}; its keys: {sorted(map(str, item))}")
        return item[key]
    for k in defaults:
        if k in item:
            return item[k]
    raise KeyError(
        f"the item has none of the {what} keys {defaults}; its keys: "
        f"{sorted(map(str, item))}; name yours with WrappedDataset(ds, {option}=...)"
    )


def split_fields(item: Any, image_key: Any, target_key: Any) -> tuple[Any, Any, tuple]:
    """(image, target, further fields) of a dataset item: a sequence, a dict, or a bare image.

    The further fields are what the item holds besides its image and target: a sequence's
    other fields in order (``(image, target, path)``: ``(path,)``), or a dict's other keys as
    one dict (``({"path": ...},)``); none for a bare image or a two-field item.
    """
    if callable(target_key):
        target = target_key(item)
        target_key = False  # taken
    if isinstance(item, dict):
        image = _pick(item, image_key, _IMAGE_KEYS, "image", "image_key")
        if target_key is not False:
            target = _pick(item, target_key, _TARGET_KEYS, "target", "target_key")
        taken = {_key_of(item, image_key, _IMAGE_KEYS)}
        if target_key is not False:
            taken.add(_key_of(item, target_key, _TARGET_KEYS))
        rest = {k: v for k, v in item.items() if k not in taken}
        return image, target, (rest,) if rest else ()
    if isinstance(item, (tuple, list)):
        if len(item) < 2 and target_key is not False:
            raise TypeError(f"the item is a {type(item).__name__} of {len(item)}; expected (image, target, ...)")
        at = 0 if image_key is None else image_key
        image = item[at]
        # A target function's target stands for the second field (what it reads, as a rule).
        target_at = 1 if target_key is None or target_key is False else target_key
        if target_key is not False:
            target = item[target_at]
        taken_at = {_position(at, len(item)), _position(target_at, len(item))}
        return image, target, tuple(v for j, v in enumerate(item) if j not in taken_at)
    if target_key is not False:
        target = NO_TARGET
    return item, target, ()


def _key_of(item: dict, key: Any, defaults: tuple[str, ...]) -> Any:
    """The key :func:`_pick` took ``item``'s field from."""
    return key if key is not None else next(k for k in defaults if k in item)


def _position(at: Any, length: int) -> Any:
    """A tuple position as a non-negative index (``-1``: the last)."""
    return at + length if isinstance(at, int) and at < 0 else at


def item_path(item: Any) -> str | None:
    """A path the item carries (a ``path``-like dict key, or a str in a tuple), if any."""
    values = (
        [item.get(k) for k in _PATH_KEYS]
        if isinstance(item, dict)
        else list(item)
        if isinstance(item, (tuple, list))
        else []
    )
    for v in values:
        if isinstance(v, (str, os.PathLike)):
            return os.fspath(v)
    return None


class WrappedDataset(HoldsPipeline, torch.utils.data.Dataset):
    """A map-style dataset (``__len__`` + ``__getitem__``) as a fastload dataset.

    Items may be ``(image, target, ...)``, a dict (image under ``"image"``/``"img"``, target
    under ``"label"``/``"target"``), or a bare image (target -1). What an item holds besides
    its image and target is carried: a sequence's further fields, a dict's other keys (as one
    dict), batched as DataLoader's ``default_collate`` batches them and handed out after the
    targets (``for images, labels, paths in loader``). Images may be PIL (converted to RGB), uint8
    numpy H×W×C or H×W, or uint8 tensors C×H×W or H×W×C. Targets: see
    :mod:`fastload.targets`.

    Args:
        dataset: The dataset; pickled to worker processes started by spawn/forkserver.
        transform: fastload transforms applied after conversion (``f(img, rng)`` or ``f(img)``).
        image_key: The image's dict key or tuple position (default: see above).
        target_key: The target's dict key or tuple position, or a function ``item -> target``
            (a module-level function when workers are started by spawn).
        first_item_decides: An item that is not an image, before any item that was one (in
            this process), raises :class:`ItemsNotImages` (the caller then loads the dataset
            another way) instead of its sample's TypeError.

    Raises:
        TypeError: ``dataset`` is an IterableDataset or has no ``__len__``/``__getitem__``.
    """

    #: The dataset as given to the Loader, set by the Loader: what ``get_worker_info().dataset``
    #: shows in a worker. None when made otherwise.
    given: Any = None

    #: Loaded whole (its items are the user's, not planned) and without ``out=``.
    load_traits: ClassVar[LoadTraits] = LoadTraits()

    def __init__(
        self,
        dataset: Any,
        transform: Any = None,
        *,
        image_key: Any = None,
        target_key: Any = None,
        first_item_decides: bool = False,
    ) -> None:
        name = type(dataset).__name__
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError(
                f"{name} is an IterableDataset; fastload needs random access (__len__ and "
                "__getitem__), or a fastload stream such as TFRecordStream"
            )
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(
                f"{name} is not a dataset fastload can load: it needs __len__ and __getitem__ "
                "(a map-style torch Dataset) or load(index, epoch, seed) (a fastload dataset)"
            )
        self.dataset = dataset
        self.transform = as_compose(transform)
        self.image_key, self.target_key = image_key, target_key
        self.first_item_decides = first_item_decides
        # Whether an item was an image in this process: a worker's copy starts as it was when
        # the worker started, so each worker decides from the first item it reads.
        self._images_seen = False

    def __len__(self) -> int:
        return len(self.dataset)

    def load(self, index: int, epoch: int = 0, seed: int = 0) -> tuple:
        """Item ``index`` as (H×W×C uint8, target), transformed with the rng of (seed, epoch, index);
        then the item's further fields (see :func:`split_fields`), where it has some."""
        item = self.dataset[index]
        image: Any = _UNSPLIT
        try:
            image, target, extras = split_fields(item, self.image_key, self.target_key)
            image = views_of(image, bool(self.transform.transforms))
        except (TypeError, KeyError) as e:
            try:
                path = item_path(item) or self.describe(index)
            except Exception:  # naming must never hide the real error
                path = None
            # Named here, with the cause unnamed: the loader raises the named error as it
            # is, and on_error="skip" records the cause beside the sample's name.
            text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            kind = SampleKeyError if isinstance(e, KeyError) else SampleTypeError
            if self.first_item_decides and not self._images_seen and item is not None:
                kind = _not_images(image, e) or kind
            raise kind(f"{sample_name(index, path)}: {text}", index, path) from e
        self._images_seen = True
        if self.transform.transforms:
            image = self.transform(image, sample_rng(seed, epoch, index))
        return (image, target, *extras)

    def describe(self, index: int) -> str:
        """The dataset's name for the sample: its ``describe(i)``, a path from ``samples``/
        ``imgs`` (torchvision) or ``paths``/``files``, else "sample N"."""
        ds = self.dataset
        if isinstance(ds, Describes):
            return str(ds.describe(index))
        for attr in ("samples", "imgs", "paths", "files"):
            entries = getattr(ds, attr, None)
            try:
                entry = entries[index] if entries is not None else None
            except Exception:
                continue
            entry = entry[0] if isinstance(entry, (tuple, list)) and entry else entry
            if isinstance(entry, (str, os.PathLike)):
                return os.fspath(entry)
        return f"sample {index}"

    def __getitem__(self, index: int) -> tuple:
        image, target, *extras = self.load(int(index))
        return (contiguous(image), target, *extras)

    def summary(self) -> dict:
        return {"type": f"WrappedDataset({type(self.dataset).__name__})", "samples": len(self)}

    def __repr__(self) -> str:
        return f"WrappedDataset({self.dataset!r}, transform={self.transform!r})"
