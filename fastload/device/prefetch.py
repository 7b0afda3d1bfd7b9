"""``fl.CudaPrefetcher``: the device driver over your own iterable of host batches.

For a DataLoader of your own (or any iterable of uint8 batches): each batch is copied on a
CUDA side stream and normalized ``depth`` batches ahead of the training step, exactly as
the Loader's batches are (:mod:`fastload.device.driver`, :mod:`fastload.device.copy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .copy import HostCopy
from .driver import DeviceDriver, Output, Stats
from .normalize import Normalizer

__all__ = ["CudaPrefetcher", "Normalizer", "Stats"]


class CudaPrefetcher(DeviceDriver):
    """Overlaps host-to-device copies and normalization with the consumer's work.

    Iterates over ``iterable`` of HostBatches, or of (uint8 N×H×W×C images, labels, ...)
    tuples, and yields (images, labels, ...) on ``device`` (images: a list of N×C×H×W
    tensors, one per view, for multi-view batches); with ``indices``, (images, labels,
    indices), the indices staying on the host. On a CPU device it normalizes synchronously.

    Args:
        iterable: The batches; a lease (a reused host buffer) is released once the
            buffer's copy is done.
        device: Target device; None means cuda if available, else cpu.
        depth: Batches in flight on the side stream.
        normalizer: Applied on the side stream (default: ImageNet float32).
        indices: Also yield each batch's int64 sample indices (a CPU copy).
        stream: The CUDA side stream to use (default: a new one).
    """

    def __init__(
        self,
        iterable: Iterable,
        device: Any = None,
        depth: int = 2,
        normalizer: Normalizer | None = None,
        indices: bool = False,
        stream: Any = None,
    ) -> None:
        super().__init__(HostCopy(), device, depth, normalizer, indices, stream)
        self.iterable = iterable

    def __iter__(self) -> Iterator[Output]:
        return self.run(self.iterable)
