"""A source's torch DataLoader across its passes: each pass's items waited for in ticks
(:class:`PassWait`, :func:`worker_batches`), and the workers that persist between passes
resumed, drained of a pass given up, restarted after a failure and closed
(:class:`WorkerLoader`), for the indexed and the stream process runners alike."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

from ..batch import HostBatch
from ..datasets import changes, waits
from ..encoded import EncodedBatch
from ..system import user_stacklevel
from . import deaths, startup
from .closing import GRACE_S, close_workers, end_workers, wait_tick
from .failures import PassClosed, WorkerFailure, WorkersReplaced, from_worker, interrupted, pass_failure, worker_failure
from .inflight import InFlight
from .startup import START_TRIES, Starting
from .waiting import Stop, deadline, wait_until
from .workers import WorkerOptions, start_workers

#: How long the batches a pass given up left under way may take before its persistent workers
#: are replaced instead (about one batch of 2-8 MP photos on a slow core; a sample stuck for
#: good would hold the next pass for ever, or up to the Loader's timeout and then fail it).
DRAIN_S = 5.0

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
        drain_limit: Seconds the drain this wait is part of may take, all its items together,
            in place of the Loader's ``timeout`` for each item; 0: a pass's wait.
        drain_until: That drain's deadline (monotonic).
    """

    options: WorkerOptions
    inflight: InFlight
    dataset: Any
    closed: threading.Event
    drain_limit: float = 0.0
    drain_until: float = 0.0

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
                with deaths.waiting(self.inflight), waits.bounded(0 if workers else self.options.timeout, self.closed):
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
        end = self.drain_until if self.drain_limit else deadline(timeout, start=started)
        wait_until(ready, Stop(self.closed), end, self.timed_out)
        return got[0]

    def timed_out(self) -> WorkerFailure:
        """The error of a pass whose workers gave no batch within the Loader's ``timeout`` (or of a
        drain that did not end by its deadline)."""
        message = f"DataLoader timed out after {self.options.timeout:g} seconds"
        if self.drain_limit:
            message = f"the batches a pass given up left under way were not done within {self.drain_limit:g} s"
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


class WorkerLoader:
    """A source's DataLoader across passes: new workers for each pass, or persistent ones
    (``options.persistent``) resumed for the next pass once they finished what the last one
    left them (:meth:`drain`), and new ones after a failure (:meth:`restart`) or where the
    dataset changed since they copied it (:mod:`fastload.datasets.changes`).

    No name holds the DataLoader while a pass starts, only a box emptied on the way out: an
    error raised there keeps the frame in its traceback (and ``close()`` from another thread
    may let go of the DataLoader meanwhile; the pass then raises the closed error).

    Args:
        new_loader: Makes the DataLoader (again after a failure: DataLoader does not restart
            persistent workers after one of them died).
        options: The workers' settings.
        inflight: The workers' in-flight table.
        closed: The source's closed event.
        renew: Gives the next generation of workers fresh buffers (the old ones' memory goes
            with the old workers).
        stop: Ends the pass under way: the workers are sent, or make, no more of its batches.
        dataset: Names samples in errors, or None.
        watched: The dataset the workers copy as they start (the Loader's, or the stream):
            persistent workers that copied it before a change are replaced as the next pass
            starts, so that the pass sees the change (:mod:`fastload.datasets.changes`).
            None: not watched.
    """

    def __init__(
        self,
        new_loader: Callable[[], DataLoader],
        options: WorkerOptions,
        inflight: InFlight,
        closed: threading.Event,
        renew: Callable[[], None],
        stop: Callable[[], None],
        dataset: Any = None,
        watched: Any = None,
    ) -> None:
        self._new_loader, self.options, self.inflight, self.closed = new_loader, options, inflight, closed
        self._renew, self._stop, self.dataset, self.watched = renew, stop, dataset, watched
        self._copied: changes.Snapshot | None = None  # the watched dataset as the running workers copied it
        self._loader: DataLoader | None = new_loader()
        self._started = False  # the persistent workers of _loader run
        self._running: Iterator | None = None  # their iterator (persistent workers), for drain()
        self._swap = threading.Lock()  # restart() and close() replace _loader one at a time

    def _wait(self) -> PassWait:
        return PassWait(self.options, self.inflight, self.dataset, self.closed)

    def start(self, prepare: Callable[[], None]) -> Iterator:
        """The DataLoader iterator of the next pass, whose work ``prepare()`` sets up (after the
        last pass was drained, before the workers begin this one).

        Raises:
            RuntimeError: The closed error.
            WorkerFailure: A persistent worker died or never answered the resume.
        """
        if not self.options.persistent:
            self._renew()  # new workers each pass
        elif self._started and not self._replaced():
            prepare()
            failure: BaseException | None = None
            box = [self._loader]
            try:
                if box[0] is None:
                    raise PassClosed()
                # DataLoader's resume waits for each worker, in ticks: idle now, they answer at once.
                return start_workers(box[0], self.options, running=True)
            except Exception as e:
                failure = self._wait().failure(e, 0.0)
            finally:
                box.clear()
            if isinstance(failure, WorkerFailure) or (failure is not None and self.closed.is_set()):
                try:
                    raise failure  # past the except: its __context__ is not DataLoader's error
                finally:
                    failure = None  # its traceback keeps this frame: no cycle back to it
            self.restart()  # a resume that ran past a tick leaves its iterator unusable: new workers
        it = self._start_new(prepare)
        if self.options.persistent and self.options.num_workers > 0 and self.watched is not None:
            # After the start: the workers copied the dataset there (forked, or pickled), and
            # what the copy made of it is in it (a remote WebDataset's index, finished first).
            self._copied = changes.snapshot(self.watched)
        self._started = True
        if self.options.persistent:
            self._running = it
        return it

    def _start_new(self, prepare: Callable[[], None]) -> Iterator:
        """New workers' DataLoader iterator for the next pass, ``prepare()`` run first.

        Forked workers are waited for until each has started: one stuck in the fork itself
        (:mod:`.startup`) would hold the pass for ever. Nothing of the pass has reached the
        consumer then, so the workers are replaced and the pass starts again, with a warning,
        up to :data:`~.startup.START_TRIES` times.

        Raises:
            RuntimeError: The closed error.
            WorkerFailure: Workers stuck at every try.
        """
        o = self.options
        limit = min(startup.STARTUP_S, o.timeout) if o.timeout else startup.STARTUP_S
        for tries in range(1, START_TRIES + 1):
            prepare()
            box: list[Any] = [self._loader]
            starting = Starting(self.inflight, o.num_workers) if o.num_workers and o.start_now() == "fork" else None
            forked = False
            try:
                if box[0] is None or self.closed.is_set():
                    raise PassClosed()
                box[0] = start_workers(box[0], o)
                forked = True
                stuck = starting.stuck(self.closed, limit) if starting is not None else None
                if stuck is None:
                    return box[0]
            except BaseException as e:
                # Ended while they started (close(), Ctrl-C): those not started are killed, and
                # the next pass starts new workers (persistent ones would be resumed, started or
                # not). A worker's death is the pass's failure: its error names the workers first.
                if forked and (isinstance(e, PassClosed) or not isinstance(e, Exception)):
                    self._end_start(box, starting.unstarted() if starting is not None else [])
                else:
                    box.clear()
                raise
            self._end_start(box, list(stuck.pids))
            if self.closed.is_set():
                raise PassClosed()
            if tries == START_TRIES:
                raise WorkerFailure(f"{stuck.message()}, {START_TRIES} times in a row")
            warnings.warn(f"{stuck.message()}; new workers start", WorkersReplaced, stacklevel=user_stacklevel())
        raise AssertionError("unreachable: the last try returns or raises")

    def _end_start(self, box: list, unstarted: list[int]) -> None:
        """Ends the workers of a start given up: ``unstarted`` (registered nowhere) and those
        that started are killed at once, and the DataLoader is made again (unless closed)."""
        deaths.watch(self.inflight)  # DataLoader's death handler is installed now: wrapped, it
        deaths.retire_pids(unstarted)  # drops the deaths of workers ended on purpose
        self.restart()  # the workers that started are killed at once
        end_workers(box, unstarted, grace_s=0)

    def _replaced(self) -> bool:
        """Replaces the persistent workers where they cannot take the next pass: one of them
        ended since the last pass (killed while idle: the OOM killer, a Ctrl-C to the process
        group), the dataset changed since they copied it (a new ``transform`` between epochs:
        they would go on with the old one), or the last pass did not drain within
        :data:`DRAIN_S` (or the Loader's longer ``timeout``). They are replaced first, then a
        warning says why (nothing of the next pass is lost): a program that turns warnings into
        errors gets new workers all the same. Those replaced for a change are drained and idle:
        they are asked to exit (killed only after :data:`~fastload.sources.closing.GRACE_S`);
        the others are killed at once."""
        gone = deaths.dead(self.inflight)
        grace = 0.0  # workers that cannot take the pass are killed, not waited for
        if gone:
            why = f"fastload: worker process(es) {', '.join(map(str, sorted(gone)))} ended between passes"
        else:
            try:
                self.drain(max(DRAIN_S, self.options.timeout))
            except WorkerFailure as e:
                # A batch of the pass given up that does not end (a sample stuck) or a worker that died in it.
                died = deaths.dead(self.inflight)  # else the drain's own deadline, which says so
                why = f"{e} (in the pass given up before this one)" if died else str(e)
            else:
                moved = changes.changed(self._copied, self.watched) if self._copied is not None else []
                if not moved:
                    return False
                named = ", ".join(map(repr, moved[:3])) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
                why = (
                    f"fastload: the dataset's {named} changed since its persistent worker processes copied it, "
                    "which they would not see (pass persistent_workers=False to start workers every epoch "
                    "without this warning)"
                )
                grace = GRACE_S  # idle and drained: they exit their own way
        self.restart(grace)
        warnings.warn(f"{why}; new workers start", WorkersReplaced, stacklevel=user_stacklevel())
        return True

    def drain(self, limit: float) -> None:
        """Ends the last pass of the persistent workers: ``stop()``, then the batches they were
        making for it are waited for (DataLoader's resume of the workers for the next pass would
        wait for them without a tick) and dropped.

        Args:
            limit: Seconds the drain may take, all its batches together.

        Raises:
            WorkerFailure: A worker died, or the batches took longer than ``limit``.
        """
        self._stop()
        box = [self._running]
        wait = PassWait(self.options, self.inflight, self.dataset, self.closed, limit, time.monotonic() + limit)
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

    def restart(self, grace_s: float = 0.0) -> None:
        """New workers for the next pass: the old ones are asked to exit and killed after
        ``grace_s`` (0, after a failure: at once, not waited for)."""
        with self._swap:  # close() from another thread meanwhile: no new DataLoader after it
            if self._loader is None:
                return
            pids = self.inflight.pids().values()
            deaths.retire(self.inflight)
            self._renew()
            holder = [self._loader]
            self._loader, self._started, self._running = self._new_loader(), False, None
        end_workers(holder, pids, grace_s=grace_s)

    def close(self) -> None:
        """Stops the workers, killing those not gone after a grace (:mod:`.closing`)."""
        with self._swap:
            holder: list = [self._loader]
            self._loader, self._running = None, None
            # They are the source's own (its methods, closures over it): kept, they would hold
            # the source and this in a reference cycle, its buffers with it, until gc runs.
            self._new_loader, self._renew, self._stop = _closed, _nothing, _nothing
        close_workers(self.closed, self.inflight, holder)


def _closed() -> DataLoader:
    raise RuntimeError("the source is closed: no workers start")


def _nothing() -> None:
    pass
