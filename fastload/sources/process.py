"""Process backend: torch DataLoader workers each build whole HostBatches in shared memory."""

from __future__ import annotations

import multiprocessing
import random
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from ..batch import HostBatch
from ..sampler import BatchRequest, ShardedBatchSampler
from .inflight import InFlight
from .fetch import BatchFetcher, describe

CLOSE_WAIT_S = 3.0  # close() returns after this even if a worker is stuck in a sample


@dataclass(frozen=True)
class WorkerOptions:
    """How a source runs its workers (resolved from LoaderConfig by the Loader)."""

    num_workers: int
    prefetch_factor: int = 2
    persistent: bool = True
    start_method: str | None = None
    timeout: float = 0.0
    pin: bool = False
    seed: int = 0

    @property
    def forks(self) -> bool:
        """Workers are started by fork (OpenCV's pool must be parked around it)."""
        start = self.start_method or multiprocessing.get_start_method()
        return self.num_workers > 0 and start == "fork"


def worker_init(worker_id: int) -> None:
    """Per-worker setup: single-threaded OpenCV and torch, seeds from the loader's seed."""
    import cv2

    cv2.setNumThreads(1)
    cv2.ocl.setUseOpenCL(False)
    torch.set_num_threads(1)
    info = get_worker_info()
    seed = info.seed if info is not None else worker_id
    np.random.seed(seed % 2**32)
    random.seed(seed)


@contextmanager
def opencv_parked():
    """Stops OpenCV's thread pool while workers are forked, then restores it.

    A forked child inherits the pool's state but not its threads; its first OpenCV
    call (even setNumThreads) then waits forever for them.
    """
    cv2 = sys.modules.get("cv2")
    if cv2 is None:
        yield
        return
    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(previous)


def identity(batch: Any) -> Any:
    return batch


class _EpochRequests:
    """The DataLoader's batch sampler: one pass's requests, set by the source before each pass
    (the sampler's epoch, or an explicit list such as a resumed epoch's)."""

    def __init__(self, sampler: ShardedBatchSampler) -> None:
        self.sampler, self.epoch = sampler, 0
        self.explicit: list[BatchRequest] | None = None

    def __iter__(self) -> Iterator[BatchRequest]:
        return iter(self.explicit) if self.explicit is not None else self.sampler.requests(self.epoch)

    def __len__(self) -> int:
        return len(self.explicit) if self.explicit is not None else len(self.sampler)


def dataloader_options(options: WorkerOptions, persistent: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(num_workers=options.num_workers, collate_fn=identity, timeout=options.timeout,
                              pin_memory=options.pin, generator=torch.Generator().manual_seed(options.seed))
    if options.num_workers > 0:
        kw.update(prefetch_factor=options.prefetch_factor, persistent_workers=persistent,
                  multiprocessing_context=options.start_method, worker_init_fn=worker_init)
    return kw


def is_worker_failure(error: BaseException) -> bool:
    """DataLoader's own errors for a dead or silent worker (not a worker's re-raised error)."""
    text = str(error)
    return text.startswith(("DataLoader worker (pid", "DataLoader timed out"))


def forget_frames(error: BaseException) -> BaseException:
    """Clears the tracebacks of ``error`` and its chain, and returns it.

    Raised out of a DataLoader iterator, their frames hold the iterator: wherever the
    error ends up being freed, the iterator's shutdown would run there, and after a
    worker error torch's shutdown waits 5 s per worker. The worker's own traceback is
    kept in the message text by DataLoader.
    """
    seen: set[int] = set()
    chained: BaseException | None = error
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        chained.with_traceback(None)
        chained = chained.__cause__ or chained.__context__
    return error


def worker_failure(error: BaseException, inflight: InFlight, dataset: Any) -> RuntimeError:
    """A worker death or timeout, with the sample(s) that were being loaded."""
    forget_frames(error)
    busy = inflight.busy()
    pids = {int(p) for p in re.findall(r"\d+", str(error).split(")")[0])} if "pid" in str(error) else set()
    named = [b for b in busy if b.pid in pids] or busy
    where = "; ".join(f"worker {b.worker} (pid {b.pid}) was loading sample {b.index} "
                      f"({describe(dataset, b.index)}) for {b.seconds:.1f} s" for b in named)
    lost = isinstance(error, (ConnectionError, EOFError))
    head = ("fastload: lost a DataLoader worker process or its batch (a crash: out of memory, "
            f"or a fault in a decoder?): {error!r}") if lost else f"fastload: {error}"
    return RuntimeError(f"{head}; {where or 'no sample was in flight'}")


def drop_in_background(holder: list, wait_s: float = CLOSE_WAIT_S) -> None:
    """Drops the last references in ``holder`` on a daemon thread, waiting up to ``wait_s``.

    DataLoader has no public shutdown: dropping the last reference to it (or to its
    iterator) joins the workers, waiting 5 s for each stuck one before terminating it.
    """
    done = threading.Event()

    def drop() -> None:
        holder.clear()
        done.set()

    threading.Thread(target=drop, name="fastload-shutdown", daemon=True).start()
    done.wait(wait_s)


class ProcessSource:
    """HostBatches built by torch DataLoader workers (or the main process with 0 workers).

    Args:
        fetcher: Builds a batch from a request, in the worker.
        sampler: This rank's requests per epoch.
        options: Worker count, prefetch, persistence, start method, timeout, pinning.
    """

    def __init__(self, fetcher: BatchFetcher, sampler: ShardedBatchSampler, options: WorkerOptions) -> None:
        self.fetcher, self.options = fetcher, options
        self.inflight = fetcher.inflight
        self._requests = _EpochRequests(sampler)
        self._loader: DataLoader | None = DataLoader(fetcher, batch_sampler=self._requests,
                                                     **dataloader_options(options, options.persistent))

    def batches(self, epoch: int, requests: Iterable[BatchRequest] | None = None) -> Iterator[HostBatch]:
        """One pass: the sampler's requests of ``epoch``, or ``requests`` when given."""
        if self._loader is None:
            raise RuntimeError("process source is closed")
        self._requests.epoch = epoch
        self._requests.explicit = None if requests is None else list(requests)
        if self.options.forks:
            with opencv_parked():
                it = iter(self._loader)
        else:
            it = iter(self._loader)
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                except Exception as e:
                    if self.options.num_workers == 0:
                        raise  # loaded in this process: keep the whole traceback
                    # A worker that dies while its batch is in transit leaves the receiving end
                    # of the pipe or of the shared-memory hand-over without a peer.
                    if isinstance(e, (ConnectionError, EOFError)) or is_worker_failure(e):
                        raise worker_failure(e, self.inflight, self.fetcher.dataset) from e
                    raise forget_frames(e)
                yield batch
        finally:
            # Ours may be the last reference (closed meanwhile, or no persistent workers), and
            # an error's traceback would keep it in this frame: drop it where a worker stuck
            # in a sample cannot hold up this thread.
            holder = [it]
            del it
            drop_in_background(holder)

    def close(self) -> None:
        """Shuts the workers down; returns within a few seconds even if one is stuck."""
        if self._loader is None:
            return
        holder: list = [self._loader]
        self._loader = None
        drop_in_background(holder)
