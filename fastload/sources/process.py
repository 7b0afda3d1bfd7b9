"""Process backend: torch DataLoader workers each make whole batches in shared memory."""

from __future__ import annotations

import errno
import multiprocessing
import pickle
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from ..batch import HostBatch
from ..collate import pinning_on
from ..datasets import waits
from ..datasets.subset import SubsetDataset
from ..datasets.wrap import WrappedDataset
from ..encoded import EncodedBatch, SourceBatch
from . import deaths
from .closing import close_workers, end_workers, wait_tick
from .descriptors import check_descriptors, dataloader_descriptors, descriptor_limit
from .failures import (
    PassClosed,
    WorkerFailure,
    from_worker,
    in_worker,
    interrupted,
    pass_failure,
    worker_failure,
)
from .frozen import parent_objects_frozen
from .handoff import detached
from .indexed import IndexedSource, Maker
from .inflight import InFlight
from .pools import BufferPool
from .request import BatchRequest, PassRequest
from .sampler import ShardedBatchSampler
from .start import worker_start_method
from .waiting import Stop, deadline, wait_until


@runtime_checkable
class Tracked(Protocol):
    """A dataset DataLoader's workers run that marks the samples in flight (the workers register)."""

    inflight: InFlight


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

    def start_now(self) -> str:
        """How workers started now start: ``start_method`` (the Loader's
        ``multiprocessing_context``), else :func:`~fastload.sources.start.worker_start_method`'s
        choice at this moment (a GPU decoder alive in this process changes it)."""
        # Read, never fixed: get_start_method() without allow_none would set the program's default.
        return worker_start_method(self.start_method) or multiprocessing.get_all_start_methods()[0]


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


def dataloader_options(options: WorkerOptions, persistent: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        num_workers=options.num_workers,
        collate_fn=identity,
        # DataLoader waits for a batch in ticks, between which the pass looks at its closed event
        # and its own timeout (worker_batches). Without workers it refuses a timeout: the waits are ours.
        timeout=wait_tick(options.timeout) if options.num_workers > 0 else 0,
        # Without workers a batch is made here, in memory its pool pinned for the device:
        # DataLoader would pin its labels again, in the context of the current device.
        pin_memory=options.pin and options.num_workers > 0,
        generator=torch.Generator().manual_seed(options.seed),
    )
    if options.num_workers > 0:
        kw.update(
            prefetch_factor=options.prefetch_factor,
            persistent_workers=persistent,
            multiprocessing_context=options.start_method,  # None: start_workers decides, as they start
            worker_init_fn=worker_init,
        )
    return kw


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
    method = options.start_now()  # decided as they start: a GPU decoder alive now means a fork server
    try:
        with pinning_on(options.pin_device if options.pin else None):
            if options.num_workers > 0 and not running:
                loader.multiprocessing_context = method
            if options.num_workers == 0 or method != "fork":
                return iter(loader)
            with opencv_parked(), parent_objects_frozen():
                return iter(loader)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise descriptor_limit(e, doing) from None
        raise
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        if running or options.start_method is not None or method != "forkserver":
            raise
        # Our choice, not the program's: say why, and how to fork anyway.
        raise type(e)(
            f"{e}; fastload starts these workers with a fork server because a decode='gpu' decoder is "
            "alive in this process (workers forked beside one crashed on a GPU), so the dataset and its "
            "transforms must pickle; or name multiprocessing_context='fork' to fork anyway"
        ) from e


END = object()  # what PassWait.next returns at the end of DataLoader's items


@dataclass(frozen=True)
class PassWait:
    """How a pass waits for the next item of a DataLoader iterator: in DataLoader's ticks
    (:func:`~fastload.sources.closing.wait_tick`) through the runners' one wait
    (:func:`~fastload.sources.waiting.wait_until`), which between two looks at the closed
    event and the Loader's ``timeout``; each tick looks at the workers' deaths. Failures
    become errors that name the samples in flight.

    Args:
        options: The workers' settings (``timeout``: the Loader's, 0: none).
        inflight: The workers' in-flight table.
        dataset: Names samples in errors, or None.
        closed: Set by ``close()``: the wait ends with the closed error within a tick.
    """

    options: WorkerOptions
    inflight: InFlight
    dataset: Any
    closed: threading.Event

    def next(self, box: list) -> Any:
        """The next item of the iterator ``box[0]``, or :data:`END`.

        The iterator comes in a box (a list the caller empties when done with it): no frame of
        an error raised here holds it. Each error is made past the ``except`` that caught
        DataLoader's (no ``__context__``), with DataLoader's tracebacks cleared, so an error the
        program keeps keeps no worker alive.

        Raises:
            RuntimeError: The closed error (:data:`~fastload.sources.failures.CLOSED`).
            WorkerFailure: A worker died, its batch was lost, or no batch came in ``timeout``.
        """
        workers = self.options.num_workers > 0
        started = time.monotonic()
        got: list = []

        def ready(_seconds: float) -> bool:  # a DataLoader tick (wait_tick) bounds each wait, not WAIT_S
            failure: BaseException | None = None
            try:
                if workers:
                    deaths.check(self.inflight)  # a worker that died during the consumer's step
                with deaths.waiting(), waits.bounded(0 if workers else self.options.timeout, self.closed):
                    got.append(next(box[0]))  # without workers, loaded here: our own waits end in time
                return True
            except StopIteration:
                got.append(END)
                return True
            except waits.Interrupted as e:
                failure = interrupted(e)
            except Exception as e:
                if not workers and not self.closed.is_set():
                    raise  # loaded in this process: keep the whole traceback
                failure = self.failure(e, time.monotonic() - started)
            if failure is None:
                return False  # DataLoader's tick: wait on
            try:
                raise failure  # past the except: its __context__ is not DataLoader's error
            finally:
                failure = None  # its traceback keeps this frame: no cycle back to it

        # The Loader's timeout is the runners' one deadline; without workers it bounds our own
        # waits in the sample instead (waits.bounded), as DataLoader's timeout needs workers.
        timeout = self.options.timeout if workers else 0.0
        wait_until(ready, Stop(self.closed), deadline(timeout, start=started), self.timed_out)
        return got[0]

    def timed_out(self) -> WorkerFailure:
        """The error of a pass whose workers gave no batch within the Loader's ``timeout``."""
        message = f"DataLoader timed out after {self.options.timeout:g} seconds"
        return worker_failure(RuntimeError(message), self.inflight, self.dataset)

    def failure(self, error: Exception, waited: float) -> BaseException | None:
        """What the pass raises for ``error`` out of DataLoader, after waiting ``waited`` s for
        an item (see :func:`~fastload.sources.failures.pass_failure`); None: wait on."""
        if self.closed.is_set():  # e.g. a batch arriving in a buffer close() let go of
            return PassClosed()
        return pass_failure(
            error,
            died=deaths.dead(self.inflight),
            inflight=self.inflight,
            dataset=self.dataset,
            waited=waited,
            tick=wait_tick(self.options.timeout),
        )


def worker_batches(
    it: Iterator, options: WorkerOptions, inflight: InFlight, dataset: Any, closed: threading.Event
) -> Iterator:
    """The items of a DataLoader iterator, waited for as :class:`PassWait` waits: its failures
    turned into errors that name the samples in flight, the closed error within a tick of
    ``closed`` being set (also while a worker never answers).

    This generator owns ``it``: when it ends, ``it`` is dropped in the background (with no
    persistent workers, ours is the last reference, and dropping it joins workers that may be
    stuck in a sample; those not gone after a grace are killed, see :mod:`.closing`)."""
    box = [it]
    del it  # only the box holds it: an error's traceback keeps this frame (see forget_frames)
    workers = options.num_workers > 0
    wait = PassWait(options, inflight, dataset, closed)
    if workers:
        deaths.watch(inflight)
    try:
        while (item := wait.next(box)) is not END:
            yield item
    finally:
        item = None  # the frame may outlive the pass in an error's traceback: it keeps no batch
        pids = inflight.pids().values() if workers and not options.persistent else ()
        if workers and not options.persistent:
            deaths.retire(inflight)
        if closed.is_set():  # close() waits for the workers and kills them: the consumer raises at once
            end_workers(box, grace_s=0)
        else:
            end_workers(box, pids)


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
        super().__init__(maker, sampler)
        self.pool, self.options, self.cpu_share = pool, options, cpu_share
        self._requests = PassRequests()
        self._loader: DataLoader | None = self._new_loader()
        self._started = False  # the persistent workers of _loader run
        self._running: Iterator | None = None  # their iterator (persistent workers), for drain()

    def _new_loader(self) -> DataLoader:
        return DataLoader(
            WorkerBatches(self.maker, self.pool),
            batch_sampler=self._requests,
            **dataloader_options(self.options, self.options.persistent),
        )

    def batches(self, run: PassRequest) -> Iterator[SourceBatch]:
        """One pass: the requests of ``run`` (its epoch's, or the rest of it that it resumes)."""
        if self._loader is None:
            raise PassClosed()
        if not self.options.persistent:
            self._renew_buffers()  # new workers each pass
        try:
            # No name holds the DataLoader iterator here: worker_batches owns it (see there).
            items = worker_batches(
                self._start(self.requests(run)), self.options, self.inflight, self.dataset, self._closed
            )
            # Out of the worker's buffer at once (the pin-memory thread has copied a pinned batch).
            for batch in items:
                yield detached(batch)
        except WorkerFailure:
            self.restart()
            raise

    def _start(self, requests: Iterable[BatchRequest]) -> Iterator:
        """The DataLoader iterator of a pass over ``requests``: new workers, or the persistent
        ones, once they finished what the last pass left them (:meth:`drain`).

        No name holds the DataLoader here, only a box emptied on the way out: an error raised
        here keeps this frame in its traceback (close() from another thread may also let go
        of the DataLoader meanwhile; the pass then raises the closed error).
        """
        if self.options.persistent and self._started:
            self.drain()
            self._requests.current = requests
            failure: BaseException | None = None
            box = [self._loader]
            try:
                if box[0] is None:
                    raise PassClosed()
                # DataLoader's resume waits for each worker, in ticks: idle now, they answer at once.
                return start_workers(box[0], self.options, running=True)
            except Exception as e:
                failure = PassWait(self.options, self.inflight, self.dataset, self._closed).failure(e, 0.0)
            finally:
                box.clear()
            if isinstance(failure, WorkerFailure) or (failure is not None and self._closed.is_set()):
                try:
                    raise failure  # past the except: its __context__ is not DataLoader's error
                finally:
                    failure = None  # its traceback keeps this frame: no cycle back to it
            self.restart()  # a resume that ran past a tick leaves its iterator unusable: new workers
        self._requests.current = requests
        box = [self._loader]
        try:
            if box[0] is None:
                raise PassClosed()
            it = start_workers(box[0], self.options)
        finally:
            box.clear()
        self._started = True
        if self.options.persistent:
            self._running = it
        return it

    def drain(self) -> None:
        """Ends the last pass of the persistent workers: no more of its requests are sent, and
        the batches they were making for it are waited for (DataLoader's resume of the workers
        for the next pass would wait for them without a tick), then dropped."""
        self._requests.stop()
        box = [self._running]
        wait = PassWait(self.options, self.inflight, self.dataset, self._closed)
        try:
            while True:
                try:
                    item = wait.next(box)
                except Exception as e:
                    if from_worker(e):  # a sample's error in a batch of the pass given up: not this pass's
                        continue
                    raise
                if item is END:
                    return
                if isinstance(item, (HostBatch, EncodedBatch)):
                    item.release()
        finally:
            box.clear()

    def restart(self) -> None:
        """New workers for the next pass (DataLoader does not restart persistent workers
        after one of them died)."""
        if self._loader is not None:
            pids = self.inflight.pids().values()
            deaths.retire(self.inflight)
            self._renew_buffers()
            holder = [self._loader]
            self._loader, self._started, self._running = self._new_loader(), False, None
            # The failure is raised at once: the old workers are killed, not waited for.
            end_workers(holder, pids, grace_s=0)

    def _renew_buffers(self) -> None:
        self.pool.reset(self.options.prefetch_factor)  # the old buffers' memory goes with the old workers

    def _end_workers(self) -> None:
        """Stops the workers, killing those not gone after a grace (:mod:`.closing`)."""
        holder: list = [self._loader]
        self._loader, self._running = None, None
        close_workers(self._closed, self.inflight, holder)
