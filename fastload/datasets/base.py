"""The dataset contract: encoded bytes + label by index, decoded and transformed on demand."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..decode import DecodeError, check_max_pixels, get_decoder
from ..decode.clean import CleanMarks
from ..storage import SharedArray
from ..transforms import Compose, as_compose


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample's augmentation: a function of its identity only."""
    return np.random.default_rng((seed, epoch, index))


class ImageDataset(torch.utils.data.Dataset):
    """Base class: subclasses implement :meth:`read` and :meth:`describe`.

    Labels live in a shared int64 array (``self.labels``); per-sample metadata must be
    held in :mod:`fastload.storage` arrays, never Python lists.

    Args:
        labels: One int label per sample, or None when the subclass provides
            ``__len__`` and ``labels`` itself (labels stored inside the records).
        transform: A Compose, a list of transforms, one transform, or None (full decode).
        decoder: A backend name from ``fastload.decode.BACKENDS``; None picks the best.
        max_pixels: Samples whose header claims more pixels fail with DecodeError before
            decoding; None uses ``fastload.decode.MAX_IMAGE_PIXELS`` (Pillow's limit)
            when the sample is decoded. Kept on the dataset, so it reaches workers.
    """

    def __init__(self, labels: Any, transform: Any = None, decoder: str | None = None, *,
                 max_pixels: int | None = None) -> None:
        if labels is not None and not isinstance(labels, SharedArray):
            labels = SharedArray(labels, np.int64)
        if labels is not None and len(labels) and labels.array.min() < 0:
            bad = int(np.argmin(labels.array))
            raise ValueError(f"labels must be >= 0; sample {bad} has {labels.array[bad]}")
        self._labels: SharedArray | None = labels
        self.transform: Compose = as_compose(transform)
        if decoder is not None:
            get_decoder(decoder)  # fail now, naming the backend, not in a worker
        self.decoder = decoder
        check_max_pixels(max_pixels)
        self.max_pixels = max_pixels
        self.epoch = 0
        self.seed = 0
        # Made now, before workers start, where the length is known (else on first use).
        try:
            self._clean: CleanMarks | None = CleanMarks(len(self))
        except (TypeError, AttributeError, NotImplementedError):
            self._clean = None

    @property
    def clean(self) -> CleanMarks:
        """The samples known to decode clean, shared by all workers: region decode, which
        cannot see corrupt data, serves only those (:mod:`fastload.decode.clean`)."""
        if self._clean is None or len(self._clean) != len(self):
            self._clean = CleanMarks(len(self))
        return self._clean

    @property
    def labels(self) -> np.ndarray:
        """Read-only int64 array of all labels (no decoding)."""
        return self._labels.array

    def __len__(self) -> int:
        return len(self._labels)

    def read(self, index: int) -> tuple[Any, int]:
        """Encoded image bytes and label of sample ``index``."""
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """A name for sample ``index`` in error messages (its path or key)."""
        return f"sample {index}"

    def check_index(self, index: int) -> None:
        n = len(self)
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for dataset of {n} samples")

    def decode_sample(self, index: int, data: Any, epoch: int, seed: int, out: np.ndarray | None = None) -> np.ndarray:
        """Decodes and transforms ``data``, the bytes of sample ``index`` (into ``out`` when it can).

        Its first decode is strict (region decode only once it decoded clean before)."""
        try:
            return self.clean.decode(index, self.transform, data, get_decoder(self.decoder),
                                     sample_rng(seed, epoch, index), out, self.max_pixels)
        except DecodeError as e:
            named = DecodeError(f"sample {index} ({self.describe(index)}): {e}")
            named.sample_index = index  # the loader adds no second name
            raise named from e

    def load(self, index: int, epoch: int = 0, seed: int = 0, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Reads, decodes and transforms sample ``index`` with the rng of (seed, epoch, index).

        With ``out``, the image is written into it where the transforms allow (the
        returned image is then ``out``).

        Raises:
            DecodeError: The sample's bytes are not a decodable image (message names it).
            IndexError: ``index`` is out of range.
        """
        self.check_index(index)
        data, label = self.read(index)
        return self.decode_sample(index, data, epoch, seed, out), label

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        """(H×W×C uint8, label) for a plain ``torch.utils.data.DataLoader``: contiguous, so
        its default collate can stack it (a flip is a negative-stride view until then)."""
        img, label = self.load(int(index), self.epoch, self.seed)
        return np.ascontiguousarray(img), label

    def set_epoch(self, epoch: int) -> None:
        """Epoch used by ``__getitem__`` (the Loader passes epochs explicitly instead)."""
        self.epoch = int(epoch)

    def summary(self) -> dict:
        """Short description for the CLI and the tuner's JSON."""
        return {"type": type(self).__name__, "samples": len(self),
                "classes": int(self.labels.max()) + 1 if len(self) else 0}
