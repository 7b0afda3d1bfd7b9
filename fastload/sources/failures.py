"""Worker failures (deaths, timeouts, lost batches) as errors that name the samples in flight."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from torch._utils import ExceptionWrapper

from ..batch import HostBatch, SampleError
from ..datasets.waits import Interrupted
from .fetch import in_flight
from .inflight import InFlight, process_state

CLOSED = "the Loader was closed (close()) during this pass"


class WorkerFailure(RuntimeError):
    """A worker process died, or no batch came in time; the message names the samples in flight."""


def is_worker_failure(error: BaseException) -> bool:
    """DataLoader's own errors for a dead or silent worker (not a worker's re-raised error)."""
    text = str(error)
    return text.startswith(("DataLoader worker (pid", "DataLoader timed out"))


def pids_of(error: BaseException) -> frozenset[int]:
    """The worker pids a DataLoader error names: "(pid 12) is killed", "(pid(s) 12, 34) exited"."""
    found = re.search(r"\(pids?(?:\(s\))? ([\d, ]+)\)", str(error))
    return frozenset(int(p) for p in found.group(1).replace(",", " ").split()) if found else frozenset()


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


def worker_failure(error: BaseException, inflight: InFlight, dataset: Any) -> WorkerFailure:
    """A worker death or timeout, with what each worker concerned was doing: the sample it
    was loading (and its state, e.g. stopped), or that it held none."""
    forget_frames(error)
    busy, pids = inflight.busy(), pids_of(error)
    dead = bool(pids)  # DataLoader names the pids of workers that died; a timeout names none
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
    if dead:
        parts.append("the next pass starts new workers")
    return WorkerFailure(f"{head}; {'; '.join(parts) or 'no sample was in flight'}")


def _state(pid: int, dead: bool) -> str:
    """ ", stopped," and the like where the process is not simply running or waiting."""
    state = process_state(pid)
    if state in ("running", "sleeping") or (dead and state in ("dead (zombie)", "dead", "gone")):
        return ""
    return f", {state},"


def interrupted(error: Interrupted) -> RuntimeError:
    """The error of a pass whose wait in this process ended early (see
    :mod:`fastload.datasets.waits`): closed, or a timeout. Its message names what the wait
    was for (the LMDB key being read); the sample has left the in-flight table by then."""
    if error.closed:
        return RuntimeError(CLOSED)
    return WorkerFailure(f"fastload: {error}")


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

    def reraise(self) -> None:
        """Raises the error in this (the receiving) process."""
        message = f"{self.message}\n\nRaised {self.where}; its traceback there:\n{self.exc_msg.rstrip()}"
        try:
            error = self.exc_type(message, self.index, self.sample)  # type: ignore[misc]
        except Exception:  # a SampleError subclass of the dataset's own, of other arguments
            error = SampleError(message, self.index, self.sample)
        raise error


def leaving(batch: Any) -> Any:
    """What a worker puts on its queue for ``batch``: a HostBatch packed in the worker's own
    thread (:meth:`HostBatch.packed`: its queue's feeder thread then calls no torch work that
    a finalizing interpreter could end inside a C++ frame), anything else as it is."""
    return batch.packed() if isinstance(batch, HostBatch) else batch


def in_worker(make: Any, worker: int | None) -> Any:
    """``make()``, or, in DataLoader worker ``worker``, its SampleError as :class:`InWorker`
    (the main process re-raises it); None: not in a worker, the error is raised here."""
    if worker is None:
        return make()
    try:
        return leaving(make())
    except SampleError as e:
        return InWorker(e, worker)


def in_worker_iter(items: Iterator, worker: int | None) -> Iterator:
    """``items``; in DataLoader worker ``worker``, a SampleError among them ends them as
    :class:`InWorker` (the main process re-raises it)."""
    if worker is None:
        yield from items
        return
    try:
        yield from map(leaving, items)
    except SampleError as e:
        yield InWorker(e, worker)
