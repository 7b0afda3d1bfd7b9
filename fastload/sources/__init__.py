"""Batch sources: where HostBatches come from (worker processes, threads, a stream).

Every source implements :class:`BatchSource`, and :func:`build_source` picks one from the
dataset and the config, so the Loader never asks which kind it holds. The Loader owns the
epoch counter and passes each pass's epoch and seed in (:class:`PassRequest`); every batch
request carries them to the workers. The device stage consumes the HostBatches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..batch import HostBatch
from .build import build_source, is_stream
from .fetch import SampleLoader
from .inflight import Busy, InFlight
from .process import ProcessSource, WorkerOptions
from .request import BatchRequest, PassRequest
from .sampler import ShardedBatchSampler
from .stream import StreamSource
from .thread import ThreadSource

if TYPE_CHECKING:
    from .resume import ResumePoint


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

    def batches(self, run: PassRequest) -> Iterator[HostBatch]:
        """One pass: epoch ``run.epoch``, or the rest of it that ``run.resumed`` (from
        :meth:`resume_point`) says, its draws from ``run.seed``."""

    def resume_point(self, state: dict) -> ResumePoint | None:
        """Where the next pass starts after a merged, checked loader state (None: a normal pass of its epoch)."""

    def reshard(self, rank: int, world_size: int, order_seed: int) -> None:
        """This rank's share from the next pass on, for another rank, world size or order seed."""

    def state_fields(self) -> dict:
        """What a state of this source must also record to be resumed (e.g. a stream's workers)."""

    def restart(self) -> None:
        """New workers for the next pass, after a worker failed."""

    def close(self) -> None:
        """Stops the workers; idempotent, prompt even if one is stuck in a sample."""


__all__ = [
    "BatchRequest",
    "BatchSource",
    "Busy",
    "InFlight",
    "PassRequest",
    "ProcessSource",
    "SampleLoader",
    "StreamSource",
    "ThreadSource",
    "WorkerOptions",
    "build_source",
    "is_stream",
]
