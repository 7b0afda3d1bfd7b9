"""Where a batch's pixels are written: one pool protocol, three pools.

A batch source leases the buffers of each batch from a :class:`BufferPool` once its sample
shape is known, writes the rows in place, and hands the batch on with the pool's
:class:`~fastload.batch.Lease`; the consumer releases it (optionally once a CUDA event has
passed) and the pool may then lend the buffer again.

- :class:`PlainPool`: a new buffer per batch (:func:`fastload.collate.batch_buffer`: shared
  memory in a DataLoader worker, pinned memory in the main process where asked): no lease.
- :class:`fastload.sources.handoff.SharedPool`: each worker process's reused memfd buffers,
  which the main process maps (a :class:`~fastload.batch.SharedLease` travels with the batch).
- :class:`fastload.sources.ring.RingPool`: the thread backend's ring of pinned buffers, each
  reused once its writers, its consumer and its copy to the device are done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..batch import Lease
from ..collate import batch_buffer, pinning_on
from ..targets import TargetSpec
from ..views import Images, SampleShape


class Writers(Protocol):
    """What writes into a leased buffer from other threads: the buffer is lent again only
    once it has ``finished()``."""

    def finished(self) -> bool: ...


@dataclass(frozen=True)
class Need:
    """What one batch needs of a pool.

    Attributes:
        n: Its rows.
        sample: The shape of one sample (one per view).
        target: The spec of its targets, where known (its first sample's).
        worker: The worker that writes it (a process's index among the workers).
        until: What writes into it from other threads: it is lent again only once this has finished.
    """

    n: int
    sample: SampleShape
    target: TargetSpec | None = None
    worker: int = 0
    until: Writers | None = None


@dataclass
class BatchBuffers:
    """The memory of one batch of ``n`` rows.

    Attributes:
        images: uint8 n×H×W×C (a tuple of them, one per view), written in place.
        labels: Room for the targets, of spec ``target`` (at least n rows), or None: allocated
            when the batch is collated, of its first target's spec.
        indices: Room for the dataset indices (int64, at least n), or None.
        target: The spec ``labels`` is of.
        lease: Gives the buffers back (None: the batch owns its memory).
    """

    images: Images
    labels: torch.Tensor | None = None
    indices: torch.Tensor | None = None
    target: TargetSpec | None = None
    lease: Lease | None = None


class BufferPool(Protocol):
    """Lends batch buffers."""

    def lease(self, need: Need) -> BatchBuffers:
        """Buffers for ``need.n`` samples of shape ``need.sample``."""

    def abandon(self, buffers: BatchBuffers, worker: int = 0) -> None:
        """Takes back buffers whose batch was never handed on (it failed while being made)."""

    def reset(self, ahead: int) -> None:
        """Before a pass with new users (new workers, or a new pass of the thread backend's)
        and up to ``ahead`` batches in flight: every buffer lent before is given up (one still
        written or copied from is lent again only once that has ended)."""

    def close(self) -> None:
        """Frees the buffers (the source is closed)."""


class PlainPool:
    """A new buffer per batch, no lease.

    Args:
        pin: Pin a buffer made in the main process (None: when CUDA is available); see
            :func:`fastload.collate.alloc_batch`.
        device: The CUDA device pinned memory is allocated for (see :func:`fastload.collate.pinning_on`).
    """

    def __init__(self, pin: bool | None = None, device: Any = None) -> None:
        self.pin, self.device = pin, device

    def lease(self, need: Need) -> BatchBuffers:
        with pinning_on(self.device if self.pin else None):
            return BatchBuffers(batch_buffer(need.n, need.sample, pin=self.pin))

    def abandon(self, buffers: BatchBuffers, worker: int = 0) -> None:
        """Nothing to take back: the memory goes with the batch."""

    def reset(self, ahead: int) -> None:
        """Nothing lent: nothing to give up."""

    def close(self) -> None:
        """Nothing held."""
