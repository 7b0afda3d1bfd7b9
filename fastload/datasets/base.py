"""The dataset contract: encoded bytes + label by index, decoded and transformed on demand."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ..batch import SampleError
from ..decode import MODULE_LIMIT, DecodeError, MaxPixels, get_decoder, resolve_max_pixels
from ..transforms.compose import DecodePipeline, as_compose
from ..verified import NOT_VERIFIED, check_bytes
from ..views import contiguous
from .protocols import LoadTraits
from .sampleplan import SamplePlan
from .storage import SharedArray, StringArray


def sample_name(index: int, where: str | None) -> str:
    """ "sample N (where)" for messages; "sample N" alone when ``where`` adds nothing."""
    plain = f"sample {index}"
    return f"{plain} ({where})" if where and where != plain else plain


class SampleDecodeError(DecodeError, SampleError):
    """A DecodeError that names its sample (``index``, ``where``): the loader adds no second name."""

    def __init__(self, message: str, index: int | None = None, where: str | None = None) -> None:
        SampleError.__init__(self, message, index, where)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample's augmentation: a function of its identity only."""
    return np.random.default_rng((seed, epoch, index))


class HoldsPipeline:
    """A dataset whose ``transform`` is always a pipeline
    (:func:`~fastload.transforms.compose.as_compose`): one assigned after construction, as
    ``ds.transform = train(160)`` between epochs for progressive resizing, or a plain
    callable, is wrapped as the constructor wraps it."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, as_compose(value) if name == "transform" else value)


class ImageDataset(HoldsPipeline, torch.utils.data.Dataset):
    """Base class: subclasses implement :meth:`read` and :meth:`describe`.

    Labels live in a shared int64 array (``self.labels``); per-sample metadata must be
    held in :mod:`fastload.datasets.storage` arrays, never Python lists.

    Args:
        labels: One int label per sample, or None when the subclass provides
            ``__len__`` and ``labels`` itself (labels stored inside the records).
        transform: A Compose, a list of transforms, one transform, a MultiView (a tuple of
            views per sample), or None (full decode).
        decoder: A backend name from ``fastload.decode.BACKENDS``; None picks the best.
        max_pixels: Samples whose header claims more pixels fail with DecodeError before
            decoding; None: no limit. By default ``fastload.decode.MAX_IMAGE_PIXELS``
            (Pillow's limit) as it is when the sample is decoded. Kept on the dataset (as
            ``self.max_pixels``: the int, ``fastload.decode.NO_LIMIT``, or None for the
            module's limit), so it reaches workers.
    """

    #: Declared (:class:`~fastload.datasets.protocols.LoadTraits`): :meth:`load` is
    #: ``finish(plan(...))`` and takes ``out=``. A subclass that defines its own ``load`` is
    #: declared neither (:meth:`__init_subclass__`) unless it declares its own ``load_traits``.
    load_traits: ClassVar[LoadTraits] = LoadTraits(planned=True, takes_out=True)

    #: Class names (label ``i`` names ``classes[i]``) where the format stores them (an image
    #: folder's subfolders, a converter's metadata); None where it does not.
    classes: list[str] | None = None
    #: Each sample's file, relative to the dataset's root, for formats of one file per sample
    #: (:class:`~fastload.ImageFolder`, :class:`~fastload.ImageList`); None for formats of
    #: records (their samples have no file a converter could name).
    paths: StringArray | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``load`` withdraws what this class declares of its ``load``: batches
        are then loaded through that ``load`` (not planned past it), without ``out=``, unless the
        subclass declares ``load_traits`` beside it (e.g. ``LoadTraits(takes_out=True)``)."""
        super().__init_subclass__(**kwargs)
        if "load" in vars(cls) and "load_traits" not in vars(cls):
            cls.load_traits = LoadTraits()

    def __init__(
        self, labels: Any, transform: Any = None, decoder: str | None = None, *, max_pixels: MaxPixels = MODULE_LIMIT
    ) -> None:
        if labels is not None and not isinstance(labels, SharedArray):
            labels = SharedArray(labels, np.int64)
        if labels is not None and len(labels) and labels.array.min() < 0:
            bad = int(np.argmin(labels.array))
            raise ValueError(f"labels must be >= 0; sample {bad} has {labels.array[bad]}")
        self._labels: SharedArray | None = labels
        self.transform: DecodePipeline = as_compose(transform)
        if decoder is not None:
            get_decoder(decoder)  # fail now, naming the backend, not in a worker
        self.decoder = decoder
        self.max_pixels = resolve_max_pixels(max_pixels)
        # Private: only __getitem__ reads them. A Loader that loads this dataset itself passes
        # its own, so set_epoch is no change its workers must see; where they read it by index
        # (inside a ConcatDataset) fastload.datasets.changes watches them by name.
        self._epoch = 0
        self._seed = 0

    @property
    def epoch(self) -> int:
        """The epoch ``__getitem__`` loads with (:meth:`set_epoch`; a Loader passes its own)."""
        return self._epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    @property
    def seed(self) -> int:
        """The seed ``__getitem__`` loads with (a Loader passes its own)."""
        return self._seed

    @seed.setter
    def seed(self, seed: int) -> None:
        self._seed = int(seed)

    @property
    def labels(self) -> np.ndarray:
        """Read-only int64 array of all labels (no decoding)."""
        return self._labels.array

    def __len__(self) -> int:
        return len(self._labels)

    def read(self, index: int) -> tuple[Any, int]:
        """Encoded image bytes and label of sample ``index``."""
        raise NotImplementedError

    #: How a changed verified sample is called ("the file changed since it was verified").
    _verified_what = "file"

    def describe(self, index: int) -> str:
        """A name for sample ``index`` in error messages (its path or key)."""
        return f"sample {index}"

    def check_index(self, index: int) -> None:
        n = len(self)
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for dataset of {n} samples")

    def _named(self, index: int, error: DecodeError) -> DecodeError:
        where = self.describe(index)
        return SampleDecodeError(f"{sample_name(index, where)}: {error}", index, where)

    def plan(self, index: int, epoch: int = 0, seed: int = 0) -> SamplePlan:
        """Reads sample ``index``, checks its header and draws its crop with the rng of
        (seed, epoch, index): the first half of :meth:`load` (see :mod:`fastload.datasets.sampleplan`).

        Raises:
            DecodeError: The header is unreadable or over the pixel limit (names the sample).
            IndexError: ``index`` is out of range.
        """
        self.check_index(index)
        data, label = self.read(index)
        return self._plan_bytes(index, data, label, epoch, seed)

    def read_checked(self, index: int) -> tuple[Any, Any]:
        """Sample ``index``'s encoded bytes and label as :meth:`read` gives them, a verified
        sample's bytes first checked against its checksum (what a converter copies: bytes that
        changed since they were verified must not be copied, nor verified again, silently).

        Raises:
            ChangedSinceVerifiedError: They changed since they were verified (names the sample).
        """
        data, label = self.read(index)
        check_bytes(data, self.verified_checksum(index), index, self.describe(index), self._verified_what)
        return data, label

    def verified_checksum(self, index: int) -> int:
        """The CRC32C sample ``index``'s bytes had when they were verified strictly, or
        :data:`fastload.verified.NOT_VERIFIED` (the default: datasets that record checksums
        override it)."""
        return NOT_VERIFIED

    def _plan_bytes(
        self, index: int, data: Any, label: Any, epoch: int, seed: int, verified: bool | None = None
    ) -> SamplePlan:
        # ``verified``: checked already where the bytes were read (TFRecord checks a record's
        # data, not its image); None: a verified sample whose bytes changed is refused here,
        # before anything decodes it.
        if verified is None:
            verified = check_bytes(
                data, self.verified_checksum(index), index, self.describe(index), self._verified_what
            )
        rng = sample_rng(seed, epoch, index)
        try:
            if verified:
                steps = self.transform.plan_decode(data, get_decoder(self.decoder), rng, self.max_pixels, verified=True)
            else:
                steps = self.transform.plan_decode(data, get_decoder(self.decoder), rng, self.max_pixels)
        except DecodeError as e:
            raise self._named(index, e) from e
        return SamplePlan(index, data, label, rng, steps, verified)

    def finish(self, plan: SamplePlan, pixels: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Decodes, resizes and transforms a planned sample (into ``out`` when it can): the
        second half of :meth:`load`. ``pixels``: its planned region, already decoded.

        Raises:
            DecodeError: The bytes are not a decodable image (the message names the sample).
        """
        decoder = get_decoder(self.decoder)
        try:
            return self.transform.finish_decode(plan.data, decoder, plan.steps, plan.rng, out, self.max_pixels, pixels)
        except DecodeError as e:
            raise self._named(plan.index, e) from e

    def load(self, index: int, epoch: int = 0, seed: int = 0, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Reads, decodes and transforms sample ``index`` with the rng of (seed, epoch, index).

        With ``out``, the image is written into it where the transforms allow (the
        returned image is then ``out``).

        ``finish(plan(index, epoch, seed), out=out)``: one path for ``ds[i]``, a worker's
        sample and a batch planned ahead, so each decodes as cheaply as the others.

        Raises:
            DecodeError: The sample's bytes are not a decodable image (message names it).
            IndexError: ``index`` is out of range.
        """
        planned = self.plan(index, epoch, seed)
        return self.finish(planned, out=out), planned.label

    def __getitem__(self, index: int) -> tuple[np.ndarray | tuple[np.ndarray, ...], int]:
        """(H×W×C uint8, label) for a plain ``torch.utils.data.DataLoader`` (a tuple of them per
        view for a MultiView): contiguous, so its default collate can stack it (a flip is a
        negative-stride view until then)."""
        img, label = self.load(int(index), self.epoch, self.seed)
        return contiguous(img), label

    def set_epoch(self, epoch: int) -> None:
        """Epoch used by ``__getitem__`` (the Loader passes epochs explicitly instead)."""
        self._epoch = int(epoch)

    def summary(self) -> dict:
        """Short description for the CLI and the tuner's JSON."""
        return {
            "type": type(self).__name__,
            "samples": len(self),
            "classes": int(self.labels.max()) + 1 if len(self) else 0,
        }
