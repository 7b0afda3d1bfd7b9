"""The typed values that cross the pipeline's seams: a host batch and what was skipped.

A batch source (process workers, threads, a stream) yields :class:`HostBatch` objects;
the device stage copies and normalizes them and then calls :meth:`HostBatch.release`,
which hands a reused buffer back to its source only once it is safe to rewrite.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .views import Images, batch_len, map_images


class Lease(Protocol):
    """A reused host buffer lent to the consumer; ``release`` gives it back."""

    def release(self, event: Any = None) -> None: ...


@dataclass(frozen=True)
class SkippedSample:
    """A sample that failed under ``on_error="skip"`` and was replaced by another."""

    epoch: int
    index: int
    where: str  # file, key or record of the sample
    error: str  # "ErrorType: message"

    def __str__(self) -> str:
        return f"epoch {self.epoch}, sample {self.index} ({self.where}): {self.error}"


class SampleError(RuntimeError):
    """A sample failed to load; the message names its index and file or key.

    The original exception is the ``__cause__``.
    """

    def __init__(self, message: str, index: int | None = None, where: str | None = None) -> None:
        # One-argument construction too: DataLoader re-raises worker errors as type(e)(text).
        super().__init__(message)
        self.index, self.where = index, where

    def __reduce__(self):  # crosses process boundaries from DataLoader workers
        return type(self), (self.args[0], self.index, self.where)


@dataclass
class HostBatch:
    """One uint8 batch in host memory, as a batch source produced it.

    Attributes:
        images: uint8 N×H×W×C, or a tuple of them, one per view, for a multi-view transform
            (:mod:`fastload.views`).
        labels: The targets: int64 N for int labels, else N×... of the targets' dtype
            (see :mod:`fastload.targets`).
        indices: int64 N, the dataset index each row holds (after replacements).
        epoch: The epoch the batch belongs to (its augmentation draws).
        skipped: Samples that failed and were replaced (``on_error="skip"``).
        lease: Set when ``images`` is a reused buffer: see :meth:`release`.
    """

    images: Images
    labels: torch.Tensor
    indices: torch.Tensor
    epoch: int
    skipped: tuple[SkippedSample, ...] = ()
    lease: Lease | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return batch_len(self.images)

    def release(self, event: Any = None) -> None:
        """Gives a reused buffer back: now, or once ``event`` (recorded after its copy) completes.

        Idempotent; a no-op for batches that own their memory.
        """
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release(event)

    def pin_memory(self) -> HostBatch:
        """A copy in pinned memory (torch DataLoader's pin-memory thread calls this); this
        batch's buffer is released, the copy owns its memory."""
        pinned = dataclasses.replace(self, images=map_images(torch.Tensor.pin_memory, self.images),
                                     labels=self.labels.pin_memory(),
                                     indices=self.indices.pin_memory(), lease=None)
        self.release()
        return pinned

    def __reduce__(self):
        # A worker's slot lease travels with its batch (fastload.sources.handoff); a lease
        # of a buffer of this process cannot.
        if self.lease is not None and not getattr(self.lease, "travels", False):
            raise TypeError("a HostBatch holding a reused buffer cannot leave its process")
        return HostBatch, (self.images, self.labels, self.indices, self.epoch, self.skipped, self.lease)
