"""What the Loader asks of a batch source, declared: :class:`BatchSource`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..encoded import SourceBatch
from .fetch import SampleLoader
from .inflight import InFlight
from .request import PassRequest
from .resume import ResumePoint
from .sampler import ShardedBatchSampler


class BatchSource(Protocol):
    """One rank's batches, an epoch at a time.

    Attributes:
        inflight: Which sample each worker is loading (watchdog, worker-death errors).
        dataset: What names the samples (``describe(index)``), or None (records name themselves).
        loader: Loads one sample into its row under the error policy: the source's own, and
            what GPU decode's fall-backs load with (the same draws, the same names).
        sampler: This rank's index batches, or None for a stream.
        num_samples: Samples (or records) per epoch over all ranks, before padding.
        replays: A pass can be made again from any of its batches (an indexed source: its
            requests are dealt again; a stream's records are read once, in order).
    """

    inflight: InFlight
    replays: bool

    @property
    def sampler(self) -> ShardedBatchSampler | None: ...

    @property
    def dataset(self) -> Any: ...

    @property
    def loader(self) -> SampleLoader: ...

    @property
    def num_samples(self) -> int: ...

    def __len__(self) -> int:
        """This rank's batches per epoch."""

    def batches(self, run: PassRequest) -> Iterator[SourceBatch]:
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
