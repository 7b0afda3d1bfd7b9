"""Worker failures (deaths, timeouts, lost batches) as errors that name the samples in flight."""

from __future__ import annotations

import pickle
from collections.abc import Generator, Iterator
from typing import Any

from torch._utils import ExceptionWrapper

from ..batch import HostBatch, SampleError
from ..datasets.waits import Interrupted
from ..encoded import EncodedBatch
from .fetch import in_flight
from .inflight import InFlight, process_state

CLOSED = "the Loader was closed (close()) during this pass"


class PassClosed(RuntimeError):
    """The pass was ended by ``close()`` (from any thread): the one error of a closed pass, told by
    its type (a RuntimeError, as before, with the message :data:`CLOSED`)."""

    def __init__(self, message: str = CLOSED) -> None:
        super().__init__(message)


class WorkerFailure(RuntimeError):
    """A worker process died, or no batch came in time; the message names the samples in flight."""


class WorkersReplaced(RuntimeWarning):
    """New worker processes started for a pass, and why (a worker stuck in its start, one that
    ended between passes, a dataset changed since they copied it). Made an error by the
    program, it ends the pass, of which nothing was made yet: it is no batch's error."""


def is_worker_failure(error: BaseException) -> bool:
    """DataLoader's own errors for a dead or silent worker (not a worker's re-raised error), by
    their text: the Loader's last resort, for such an error that reaches it untold (a worker
    that died before it registered, so that no process of the in-flight table is dead). A pass
    tells worker failures by what it finds (:func:`pass_failure`), and so does the SIGCHLD
    watch (:mod:`.deaths`)."""
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


def worker_failure(
    error: BaseException, inflight: InFlight, dataset: Any, died: frozenset[int] = frozenset()
) -> WorkerFailure:
    """A worker death (the processes ``died``) or a timeout (none died), with what each worker
    concerned was doing: the sample it was loading (and its state, e.g. stopped), or that it
    held none. ``error``: what was raised, its text the message's head."""
    forget_frames(error)
    busy, pids = inflight.busy(), died
    dead = bool(pids)
    named = [b for b in busy if b.pid in pids] if dead else busy
    worker_of = {pid: w for w, pid in inflight.pids().items()}
    parts = [
        f"worker {b.worker} (pid {b.pid}){_state(b.pid, dead)} was loading {in_flight(b, dataset)} "
        f"for {b.seconds:.1f} s" + (": its batch is lost" if dead else "")
        for b in named
    ]
    parts += [
        f"worker {worker_of[pid]} (pid {pid}) was loading no sample: no batch was in progress there (only "
        "batches it had finished and not yet sent are lost)"
        if pid in worker_of
        else f"the worker (pid {pid}) was loading no sample"
        for pid in sorted(pids - {b.pid for b in named})
    ]
    told = {b.pid for b in named} | pids
    parts += [u for u in inflight.unwell() if not any(f"(pid {pid})" in u for pid in told)]
    lost = isinstance(error, (ConnectionError, EOFError))
    head = (
        (
            "fastload: lost a DataLoader worker process or its batch (a crash: out of memory, "
            f"or a fault in a decoder?): {error!r}"
        )
        if lost
        else f"fastload: {str(error).rstrip('. ')}"
    )
    if not worker_of and not inflight.threads_registered():
        # No worker process registered: they died starting. One started by spawn or forkserver
        # imports the main module again, and a script whose loop is not guarded runs it there.
        parts.append(
            "no worker process got as far as registering (one started by spawn or forkserver, as "
            "fastload starts them while a decode='gpu' decoder is alive, imports your main module "
            "again: is your loop under `if __name__ == '__main__':`?)"
        )
    if dead:
        parts.append("the next pass starts new workers")
    return WorkerFailure(f"{head}; {'; '.join(parts) or 'no sample was in flight'}")


def threads_timed_out(timeout: float, inflight: InFlight, dataset: Any) -> WorkerFailure:
    """The error of a pass on threads that got no batch within the Loader's ``timeout``."""
    error = RuntimeError(f"thread backend timed out after {timeout} s (the next pass starts new threads)")
    return worker_failure(error, inflight, dataset)


def _state(pid: int, dead: bool) -> str:
    """ ", stopped," and the like where the process is not simply running or waiting."""
    state = process_state(pid)
    if state in ("running", "sleeping") or (dead and state in ("dead (zombie)", "dead", "gone")):
        return ""
    return f", {state},"


def from_worker(error: BaseException) -> bool:
    """Whether ``error`` is one a worker raised and DataLoader re-raised here (every error a
    fastload worker sends is marked so: :class:`InWorker`, :class:`Raised`)."""
    return isinstance(error, SampleError) or getattr(error, _FROM_WORKER, False)


def pass_failure(
    error: BaseException,
    *,
    died: frozenset[int],
    inflight: InFlight,
    dataset: Any,
    waited: float,
    tick: float,
) -> BaseException | None:
    """What a pass over DataLoader workers raises for ``error``, raised by DataLoader's
    ``next()`` (or by the pass's check for deaths before it): the facts decide, not the
    error's text. None: the wait for the batch goes on (``error`` was DataLoader's tick, see
    :func:`fastload.sources.closing.wait_tick`).

    Args:
        error: What was raised.
        died: The workers found dead since (:func:`fastload.sources.deaths.dead`).
        inflight: The workers (their pids, the samples in flight).
        dataset: Names samples in the message, or None.
        waited: Seconds the pass has waited for this batch; ``tick``: DataLoader's own
            ``timeout`` (the Loader's ``timeout`` is the pass's deadline, see
            :class:`fastload.sources.worker_loader.PassWait`).

    Returns:
        A worker's own error as it is (tracebacks cleared, see :func:`forget_frames`); a
        :class:`WorkerFailure` when a worker died or its batch was lost on the way;
        DataLoader's other errors as they are; or None.
    """
    if from_worker(error):
        return forget_frames(error)
    if isinstance(error, (ConnectionError, EOFError)) or died:
        # A worker that dies while its batch is in transit leaves the receiving end of the
        # pipe or of the shared-memory hand-over without a peer.
        failure = worker_failure(error, inflight, dataset, died)
        failure.__cause__ = error  # its tracebacks cleared: it keeps no DataLoader frame
        return failure
    # DataLoader's tick is a bare RuntimeError, raised after ``tick`` s with every worker alive
    # (DataLoader's check for dead ones runs first). A worker's RuntimeError is marked, above.
    ticked = type(error) is RuntimeError and error.__cause__ is None and error.__context__ is None
    if not ticked or waited < tick * 0.9:
        return forget_frames(error)
    return None


def interrupted(error: Interrupted) -> RuntimeError:
    """The error of a pass whose wait in this process ended early (see
    :mod:`fastload.datasets.waits`): closed, or a timeout. Its message names what the wait
    was for (the LMDB key being read); the sample has left the in-flight table by then."""
    if error.closed:
        return PassClosed()
    return WorkerFailure(f"fastload: {error}")


# The attribute that marks an error a worker raised (from_worker). The error is of any type
# (the dataset's, torch's, Python's), so nothing of ours declares it; and an exception takes
# no weak reference, so a registry of marked errors would keep them alive: the mark is on it.
_FROM_WORKER = "_fastload_from_worker"


def _mark(error: BaseException) -> None:
    try:
        setattr(error, _FROM_WORKER, True)
    except (AttributeError, TypeError):  # an error type that takes no attributes: told by its type only
        pass


class InWorker(ExceptionWrapper):
    """A sample's error raised in a DataLoader worker, as the worker hands it to the main process
    in place of its batch (DataLoader re-raises an ExceptionWrapper it receives): re-raised
    there as the same error, of the same type, naming the same sample (``index``, ``where``),
    with the worker's traceback after its message. (DataLoader's own wrapper would make the
    type again from the traceback's text alone, the sample's index lost.)

    Args:
        error: The error, raised in this worker.
        worker: The worker's number.
    """

    def __init__(self, error: SampleError, worker: int) -> None:
        super().__init__((type(error), error, error.__traceback__), f"in DataLoader worker process {worker}")
        self.message = str(error.args[0]) if error.args else str(error)
        self.index, self.sample = error.index, error.where
        self.fields = _fields(error)

    def reraise(self) -> None:
        """Raises the error in this (the receiving) process."""
        message = f"{self.message}\n\nRaised {self.where}; its traceback there:\n{self.exc_msg.rstrip()}"
        try:
            error = self.exc_type(message, self.index, self.sample)  # type: ignore[misc]
        except Exception:  # a SampleError subclass of the dataset's own, of other arguments
            error = SampleError(message, self.index, self.sample)
        for key, value in self.fields.items():
            setattr(error, key, value)
        _mark(error)
        raise error


def _fields(error: BaseException) -> dict:
    """What code that catches ``error`` may read of it besides its message, that can travel to
    the main process: an OSError's errno, strerror and filename, and a dataset's own fields."""
    fields = {k: v for k, v in vars(error).items() if k not in ("index", "where")}
    if isinstance(error, OSError):
        fields.update(errno=error.errno, strerror=error.strerror, filename=error.filename)
    travels = {}
    for key, value in fields.items():
        try:
            pickle.dumps(value)
        except Exception:  # a field that cannot travel stays behind (the message names the sample)
            continue
        travels[key] = value
    return travels


class Raised(ExceptionWrapper):
    """Any other error raised in a DataLoader worker (not a sample's: a fault of fastload's
    own, memory), re-raised in the main process as DataLoader re-raises it, and marked as a
    worker's (:func:`from_worker`): a pass never takes it for one of DataLoader's own.

    Args:
        worker: The worker's number (the error is the one being handled).
    """

    def __init__(self, worker: int) -> None:
        super().__init__(where=f"in DataLoader worker process {worker}")

    def reraise(self) -> None:
        """Raises the error in this (the receiving) process."""
        try:
            super().reraise()
        except BaseException as e:
            _mark(e)
            raise


def leaving(batch: Any) -> Any:
    """What a worker puts on its queue for ``batch``: a HostBatch or an EncodedBatch packed in the
    worker's own thread (:meth:`HostBatch.packed`: its queue's feeder thread then calls no torch work that
    a finalizing interpreter could end inside a C++ frame), anything else as it is."""
    return batch.packed() if isinstance(batch, (HostBatch, EncodedBatch)) else batch


def in_worker(make: Any, worker: int | None) -> Any:
    """``make()``, or, in DataLoader worker ``worker``, its SampleError as :class:`InWorker`
    (the main process re-raises it); None: not in a worker, the error is raised here."""
    if worker is None:
        return make()
    try:
        return leaving(make())
    except SampleError as e:
        return InWorker(e, worker)
    except Exception:
        return Raised(worker)


def in_worker_iter(items: Iterator, worker: int | None) -> Generator:
    """``items``; in DataLoader worker ``worker``, a SampleError among them ends them as
    :class:`InWorker` (the main process re-raises it)."""
    if worker is None:
        yield from items
        return
    try:
        yield from map(leaving, items)
    except SampleError as e:
        yield InWorker(e, worker)
    except Exception:
        yield Raised(worker)
