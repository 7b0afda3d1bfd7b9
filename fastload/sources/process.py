"""Process backend: torch DataLoader workers each make whole batches in shared memory."""

from __future__ import annotations

import errno
import multiprocessing
import random
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from ..collate import pinning_on
from ..datasets import waits
from ..datasets.subset import SubsetDataset
from ..datasets.wrap import WrappedDataset
from ..encoded import SourceBatch
from . import deaths
from .descriptors import check_descriptors, dataloader_descriptors, descriptor_limit
from .failures import CLOSED, WorkerFailure, forget_frames, in_worker, interrupted, is_worker_failure, worker_failure
from .frozen import parent_objects_frozen
from .handoff import detached
from .indexed import IndexedSource, Maker
from .inflight import InFlight
from .pools import BufferPool
from .request import BatchRequest, PassRequest
from .sampler import ShardedBatchSampler


@runtime_checkable
class Tracked(Protocol):
    """A dataset DataLoader's workers run that marks the samples in flight (the workers register)."""

    inflight: InFlight


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
    pin_device: Any = None  # the CUDA device batches are pinned for (its context, see pinning_on)

    @property
    def forks(self) -> bool:
        """Workers are started by fork (OpenCV's pool must be parked around it)."""
        # Read, never fixed: get_start_method() without allow_none would set the program's default.
        start = (
            self.start_method
            or multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_all_start_methods()[0]
        )
        return self.num_workers > 0 and start == "fork"


def worker_init(worker_id: int) -> None:
    """Per-worker setup: single-threaded OpenCV and torch, seeds from the loader's seed."""
    import cv2

    cv2.setNumThreads(1)
    cv2.ocl.setUseOpenCL(False)
    torch.set_num_threads(1)
    # Batches travel as named shared memory: with torch's default (file descriptors sent by the
    # worker on request), the consumer waits without limit, past any timeout, for a batch of a
    # worker that is stopped. Set here, the strategy applies to this worker process only.
    torch.multiprocessing.set_sharing_strategy("file_system")
    info = get_worker_info()
    if info is not None and isinstance(info.dataset, Tracked):
        info.dataset.inflight.register(info.id)
    if info is not None and isinstance(info.dataset, ShowsDataset):
        # get_worker_info().dataset in the user's code (a dataset's __getitem__ sharding its
        # reads by worker) is the dataset given to the Loader, not the batch maker torch runs.
        object.__setattr__(info, "dataset", info.dataset.shown)
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


class PassRequests(Iterable[Any]):
    """The DataLoader's batch sampler: the requests of the pass under way, set by the source
    before each pass (DataLoader's typing wants lists of indices; a request is what
    :meth:`WorkerBatches.__getitems__` takes instead)."""

    def __init__(self) -> None:
        self.current: Iterable[BatchRequest] = ()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.current)


def dataloader_options(options: WorkerOptions, persistent: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        num_workers=options.num_workers,
        collate_fn=identity,
        # Without workers DataLoader refuses a timeout; its waits are ours then (worker_batches).
        timeout=options.timeout if options.num_workers > 0 else 0,
        # Without workers a batch is made here, in memory its pool pinned for the device:
        # DataLoader would pin its labels again, in the context of the current device.
        pin_memory=options.pin and options.num_workers > 0,
        generator=torch.Generator().manual_seed(options.seed),
    )
    if options.num_workers > 0:
        kw.update(
            prefetch_factor=options.prefetch_factor,
            persistent_workers=persistent,
            multiprocessing_context=options.start_method,
            worker_init_fn=worker_init,
        )
    return kw


def drop_in_background(holder: list, wait_s: float = CLOSE_WAIT_S, workers: Iterable[int] = ()) -> None:
    """Drops the last references in ``holder`` on a thread, waiting up to ``wait_s``; then
    kills those of the processes ``workers`` (the DataLoader's) still running, so that the
    drop ends soon after.

    DataLoader has no public shutdown: dropping the last reference to it (or to its
    iterator) joins the workers, waiting 5 s for each stuck one before terminating it.

    The thread is not a daemon: the interpreter joins it before it finalizes. What it frees
    includes tensors (batches that arrived out of order, over worker buffers), and a daemon
    thread freeing a tensor while the interpreter finalizes aborts the process (torch retakes
    the GIL inside a destructor, CPython ends the thread there: "terminate called without an
    active exception"). Where a thread started now would not be joined (threading's shutdown
    has run: atexit handlers, finalization), the references are dropped here instead.
    """
    workers = list(workers)  # read now: the drop may forget them
    if sys.is_finalizing() or not threading.main_thread().is_alive():
        holder.clear()
        return
    done = threading.Event()

    def drop() -> None:
        holder.clear()
        done.set()

    threading.Thread(target=drop, name="fastload-shutdown").start()
    if not done.wait(wait_s):
        deaths.kill_children(workers)


def start_workers(loader: DataLoader, options: WorkerOptions, running: bool = False) -> Iterator:
    """``iter(loader)``, with OpenCV's pool parked and this process's objects frozen while
    workers are forked (so that their garbage collector does not copy them, see
    :mod:`.frozen`); its pin-memory thread pins for the current device, made
    ``options.pin_device`` here. ``running``: the loader's persistent workers run already
    (a new pass opens no descriptors).

    Raises:
        OSError: Too few descriptors left for the workers' pipes (the message says what to do).
    """
    doing = f"starting {options.num_workers} worker processes"
    if options.num_workers > 0 and not running:
        check_descriptors(dataloader_descriptors(options.num_workers), doing)
    try:
        with pinning_on(options.pin_device if options.pin else None):
            if not options.forks:
                return iter(loader)
            with opencv_parked(), parent_objects_frozen():
                return iter(loader)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise descriptor_limit(e, doing) from None
        raise


def worker_batches(
    it: Iterator, options: WorkerOptions, inflight: InFlight, dataset: Any, closed: threading.Event | None = None
) -> Iterator:
    """The items of a DataLoader iterator, its failures turned into errors that name the
    samples in flight. This generator owns ``it``: when it ends, ``it`` is dropped in the
    background (with no persistent workers, ours is the last reference, and dropping it
    joins workers that may be stuck in a sample)."""
    box = [it]
    del it  # only the box holds it: an error's traceback keeps this frame (see forget_frames)
    workers = options.num_workers > 0
    if workers:
        deaths.watch(inflight)
    try:
        while True:
            try:
                if closed is not None and closed.is_set():
                    raise RuntimeError(CLOSED)
                if workers:
                    deaths.check(inflight)  # a worker that died during the consumer's step
                with deaths.waiting(), waits.bounded(0 if workers else options.timeout, closed):
                    item = next(box[0])  # without workers, loaded here: our own waits end in time
            except StopIteration:
                return
            except waits.Interrupted as e:
                raise interrupted(e) from None
            except Exception as e:
                if closed is not None and closed.is_set():  # e.g. a batch arriving in a buffer close() let go of
                    raise RuntimeError(CLOSED) from None
                if options.num_workers == 0:
                    raise  # loaded in this process: keep the whole traceback
                # A worker that dies while its batch is in transit leaves the receiving end
                # of the pipe or of the shared-memory hand-over without a peer.
                if isinstance(e, (ConnectionError, EOFError)) or is_worker_failure(e):
                    raise worker_failure(e, inflight, dataset) from e
                raise forget_frames(e)
            yield item
    finally:
        pids = inflight.pids().values() if workers else ()
        if workers and not options.persistent:
            deaths.retire(inflight)
        drop_in_background(box, workers=pids if not options.persistent else ())


def given_dataset(samples: Any) -> Any:
    """The dataset as given to the Loader, of the ``samples`` its workers load (a wrapper the
    Loader made keeps it as ``given``)."""
    if isinstance(samples, (SubsetDataset, WrappedDataset)) and samples.given is not None:
        return samples.given
    return samples


class ShowsDataset:
    """A torch Dataset the workers run that shows another as ``get_worker_info().dataset``:
    :attr:`shown`, the dataset the user gave."""

    @property
    def shown(self) -> Any:
        """What ``get_worker_info().dataset`` is in a worker."""
        raise NotImplementedError


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
        self.maker, self.pool, self.options, self.sampler = maker, pool, options, sampler
        self.cpu_share = cpu_share
        self.inflight = maker.loader.inflight
        self._requests = PassRequests()
        self._closed = threading.Event()  # seen by a pass running in another thread
        self._loader: DataLoader | None = self._new_loader()
        self._started = False  # the persistent workers of _loader run

    def _new_loader(self) -> DataLoader:
        return DataLoader(
            WorkerBatches(self.maker, self.pool),
            batch_sampler=self._requests,
            **dataloader_options(self.options, self.options.persistent),
        )

    def batches(self, run: PassRequest) -> Iterator[SourceBatch]:
        """One pass: the requests of ``run`` (its epoch's, or the rest of it that it resumes)."""
        if self._loader is None:
            raise RuntimeError(CLOSED)
        self._requests.current = self.requests(run)
        if not self.options.persistent:
            self._renew_buffers()  # new workers each pass
        try:
            # No name holds the DataLoader iterator here: worker_batches owns it (see there).
            items = worker_batches(
                start_workers(self._loader, self.options, running=self.options.persistent and self._started),
                self.options,
                self.inflight,
                self.dataset,
                self._closed,
            )
            self._started = True
            # Out of the worker's buffer at once (the pin-memory thread has copied a pinned batch).
            for batch in items:
                yield detached(batch)
        except WorkerFailure:
            self.restart()
            raise

    def restart(self) -> None:
        """New workers for the next pass (DataLoader does not restart persistent workers
        after one of them died)."""
        if self._loader is not None:
            deaths.retire(self.inflight)
            self._renew_buffers()
            holder = [self._loader]
            self._loader, self._started = self._new_loader(), False
            # The failure is raised at once: the old workers are stopped in the background,
            # not inside the timeout.
            drop_in_background(holder, wait_s=0, workers=self.inflight.pids().values())

    def _renew_buffers(self) -> None:
        self.pool.reset(self.options.prefetch_factor)  # the old buffers' memory goes with the old workers

    def close(self) -> None:
        """Shuts the workers down; returns within a few seconds even if one is stuck."""
        if self._loader is None:
            return
        self._closed.set()
        pids = self.inflight.pids().values()
        deaths.retire(self.inflight)
        holder: list = [self._loader]
        self._loader = None
        drop_in_background(holder, workers=pids)
        self.pool.close()
