"""Process backend: torch DataLoader workers each make whole batches of an indexed dataset
in shared memory (their DataLoader across passes: :class:`~.worker_loader.WorkerLoader`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from ..datasets.subset import SubsetDataset
from ..datasets.wrap import WrappedDataset
from ..encoded import SourceBatch
from .failures import WorkerFailure, in_worker
from .handoff import detached
from .indexed import IndexedSource, Maker
from .inflight import InFlight
from .pools import BufferPool
from .request import BatchRequest, PassRequest
from .sampler import ShardedBatchSampler
from .worker_loader import WorkerLoader, worker_batches
from .workers import ShowsDataset, WorkerOptions, dataloader_options


class PassRequests(Iterable[Any]):
    """The DataLoader's batch sampler: the requests of the pass under way, set by the source
    before each pass (DataLoader's typing wants lists of indices; a request is what
    :meth:`WorkerBatches.__getitems__` takes instead)."""

    def __init__(self) -> None:
        self.current: Iterable[BatchRequest] = ()
        self._generation = 0

    def __iter__(self) -> Iterator[Any]:
        return self._until_stopped(iter(self.current), self._generation)

    def _until_stopped(self, requests: Iterator[BatchRequest], generation: int) -> Iterator[BatchRequest]:
        for request in requests:
            if self._generation != generation:
                return
            yield request

    def stop(self) -> None:
        """Ends the requests of the pass under way: DataLoader sends its workers no more of them."""
        self._generation += 1


def given_dataset(samples: Any) -> Any:
    """The dataset as given to the Loader, of the ``samples`` its workers load (a wrapper the
    Loader made keeps it as ``given``)."""
    if isinstance(samples, (SubsetDataset, WrappedDataset)) and samples.given is not None:
        return samples.given
    return samples


class WorkerBatches(ShowsDataset, torch.utils.data.Dataset):
    """The torch Dataset DataLoader's workers run: a batch request in, a batch out.

    Args:
        maker: Makes the batch, in the worker (or in the main process with 0 workers).
        pool: Lends its buffers (each worker's own, or a new buffer per batch).
    """

    def __init__(self, maker: Maker, pool: BufferPool) -> None:
        self.maker, self.pool = maker, pool

    @property
    def inflight(self) -> InFlight:
        return self.maker.loader.inflight

    @property
    def shown(self) -> Any:
        """The dataset the user gave (``get_worker_info().dataset`` in a worker)."""
        return given_dataset(self.maker.loader.dataset)

    def __getitems__(self, request: BatchRequest) -> SourceBatch:
        info = get_worker_info()
        if info is None:
            return self.maker.make(request, 0, self.pool)
        return in_worker(lambda: self.maker.make(request, info.id, self.pool), info.id)


class ProcessSource(IndexedSource):
    """Batches made by torch DataLoader workers (or the main process with 0 workers).

    Args:
        maker: Makes a batch from a request, in the worker.
        pool: Lends the batches' buffers there.
        sampler: This rank's requests per epoch.
        options: Worker count, prefetch, persistence, start method, timeout, pinning.
        cpu_share: ``decode="gpu"``: the CPU share of the next request (see :class:`IndexedSource`).
    """

    def __init__(
        self,
        maker: Maker,
        pool: BufferPool,
        sampler: ShardedBatchSampler,
        options: WorkerOptions,
        cpu_share: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(maker, sampler)
        self.pool, self.options, self.cpu_share = pool, options, cpu_share
        self._requests = PassRequests()
        self.workers = WorkerLoader(
            self._new_loader,
            options,
            self.inflight,
            self._closed,
            # The old buffers' memory goes with the old workers.
            renew=lambda: self.pool.reset(options.prefetch_factor),
            stop=self._requests.stop,
            dataset=self.dataset,
            watched=self.dataset,
        )

    def _new_loader(self) -> DataLoader:
        return DataLoader(
            WorkerBatches(self.maker, self.pool),
            batch_sampler=self._requests,
            **dataloader_options(self.options, self.options.persistent),
        )

    def batches(self, run: PassRequest) -> Iterator[SourceBatch]:
        """One pass: the requests of ``run`` (its epoch's, or the rest of it that it resumes)."""
        try:
            # No name holds the DataLoader iterator here: worker_batches owns it (see there).
            # Each start deals the pass's requests anew: one whose workers were replaced as it
            # started had sent them some (see WorkerLoader._start_new).
            items = worker_batches(
                self.workers.start(lambda: setattr(self._requests, "current", self.requests(run))),
                self.options,
                self.inflight,
                self.dataset,
                self._closed,
            )
            # Out of the worker's buffer at once (the pin-memory thread has copied a pinned batch).
            for batch in items:
                yield detached(batch)
        except WorkerFailure:
            self.restart()
            raise

    def restart(self) -> None:
        """New workers for the next pass (DataLoader does not restart persistent workers
        after one of them died)."""
        self.workers.restart()

    def _end_workers(self) -> None:
        """Stops the workers, killing those not gone after a grace (:mod:`.closing`)."""
        self.workers.close()
