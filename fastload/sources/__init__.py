"""Batch sources: where HostBatches come from (worker processes, threads, a stream).

Every source implements :class:`BatchSource`, and :func:`build_source` picks one from the
dataset and the config, so the Loader never asks which kind it holds. The Loader owns the
epoch counter and passes the epoch in; the device stage consumes the HostBatches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..batch import HostBatch
from .build import build_source, is_stream
from .fetch import BatchFetcher
from .inflight import Busy, InFlight
from .process import ProcessSource, WorkerOptions
from .sampler import ShardedBatchSampler
from .stream import StreamSource
from .thread import ThreadSource

if TYPE_CHECKING:
    from .resume import Plan


class BatchSource(Protocol):
    """One rank's batches, an epoch at a time.

    Attributes:
        inflight: Which sample each worker is loading (watchdog, worker-death errors).
        dataset: What names the samples (``describe(index)``), or None (records name themselves).
        sampler: This rank's index batches, or None for a stream.
        num_samples: Samples (or records) per epoch over all ranks, before padding.
    """

    inflight: InFlight
    dataset: Any
    sampler: ShardedBatchSampler | None
    num_samples: int

    def __len__(self) -> int:
        """This rank's batches per epoch."""

    def batches(self, epoch: int, plan: Plan | None = None) -> Iterator[HostBatch]:
        """One pass: epoch ``epoch``, or the rest of it that ``plan`` (from :meth:`resume_plan`) says."""

    def resume_plan(self, state: dict) -> Plan | None:
        """The next pass after a merged, checked loader state (None: a normal pass of its epoch)."""

    def state_fields(self) -> dict:
        """What a state of this source must also record to be resumed (e.g. a stream's workers)."""

    def restart(self) -> None:
        """New workers for the next pass, after a worker failed."""

    def close(self) -> None:
        """Stops the workers; idempotent, prompt even if one is stuck in a sample."""


__all__ = [
    "BatchFetcher",
    "BatchSource",
    "Busy",
    "InFlight",
    "ProcessSource",
    "StreamSource",
    "ThreadSource",
    "WorkerOptions",
    "build_source",
    "is_stream",
]
