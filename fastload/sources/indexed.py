"""What the process and thread sources share: an indexed dataset, this rank's sampler, and close()."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..encoded import SourceBatch
from . import resume
from .fetch import SampleLoader
from .pools import BufferPool
from .request import After, BatchRequest, PassRequest
from .rowmap import RowMap
from .sampler import ShardedBatchSampler


class Maker(Protocol):
    """Makes a batch from a request: a :class:`~fastload.sources.maker.BatchMaker` (a HostBatch),
    or the GPU's :class:`~fastload.sources.packed.PackMaker` (an EncodedBatch for the device)."""

    loader: SampleLoader

    @property
    def copies(self) -> int:
        """Samples decoded beside their row and copied in (in this process)."""

    def make(self, request: BatchRequest, worker: int, pool: BufferPool, rows: RowMap | None = None) -> SourceBatch:
        """The batch of ``request``, its buffers from ``pool``, its per-row steps run by ``rows``
        (default: in turn, in this thread, as worker ``worker``)."""

    def new_pass(self) -> None:
        """The next batch learns what a pass may change (its sample shape) again."""

    def shaped(self, epoch: int) -> bool:
        """Whether the batches of ``epoch`` may be made at once (their shape is fixed here)."""


class IndexedSource:
    """The sampler side of a :class:`~fastload.sources.BatchSource` over an indexed dataset,
    and its close (:meth:`close`: the runner's workers end in :meth:`_end_workers`).

    Args:
        maker: Makes the batches (its loader's in-flight table names what the workers load).
        sampler: This rank's requests per epoch.
    """

    pool: BufferPool
    replays = True  # a pass is made again from any batch: its requests are dealt again
    #: ``decode="gpu"``: the CPU share for the next request, read as each is sent to a worker
    #: (:attr:`BatchRequest.cpu_share`); None: no share.
    cpu_share: Callable[[], float] | None = None

    def __init__(self, maker: Maker, sampler: ShardedBatchSampler) -> None:
        self.maker, self.sampler, self.inflight = maker, sampler, maker.loader.inflight
        self._closed = threading.Event()  # seen by a pass running in another thread

    @property
    def loader(self) -> SampleLoader:
        return self.maker.loader

    @property
    def copies(self) -> int:
        """Samples decoded beside their row and copied in (in this process)."""
        return self.maker.copies

    @property
    def dataset(self) -> Any:
        return self.maker.loader.dataset

    @property
    def num_samples(self) -> int:
        return self.sampler.num_samples

    def __len__(self) -> int:
        return len(self.sampler)

    def requests(self, run: PassRequest) -> Iterator[BatchRequest]:
        """The batch requests of pass ``run``: its epoch's, or the rest of it that ``run.resumed`` says."""
        if isinstance(run.resumed, After):
            # The pass's own requests, made again (the order is fixed by epoch and seed), less those done.
            return itertools.islice(self.requests(run.resumed.run), run.resumed.done, None)
        if run.resumed is None:
            requests = self.sampler.requests(run.epoch, run.seed)
        else:
            requests = run.resumed.requests(run.seed, self.sampler.rank, run.first)
        share = self.cpu_share
        if share is None:
            return requests
        # Lazily: each request takes the share of the moment it is sent (DataLoader draws them as it sends).
        return (dataclasses.replace(r, cpu_share=share()) for r in requests)

    def reshard(self, rank: int, world_size: int, order_seed: int) -> None:
        """Deals this rank's share anew for another rank, world size or order seed (no new workers)."""
        self.sampler = self.sampler.resharded(rank, world_size, order_seed)

    def resume_point(self, state: dict) -> resume.IndexedResume | None:
        return resume.indexed_resume(state, self.sampler.num_samples, self.sampler.rank, self.sampler.world_size)

    def state_fields(self) -> dict:
        return {}

    def restart(self) -> None:
        """New workers for the next pass, after one failed (nothing where none dies: threads)."""

    def close(self) -> None:
        """Ends the pass under way (from any thread: its ``next()`` raises the closed error),
        stops the workers and lets the pool's buffers go; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()  # first: a pass starting in another thread sees it before the workers go
        self._end_workers()
        self.pool.close()

    def _end_workers(self) -> None:
        """Stops the workers of a closed source, promptly even if one is stuck in a sample."""
        raise NotImplementedError
