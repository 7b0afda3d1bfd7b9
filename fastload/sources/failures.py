"""Worker failures (deaths, timeouts, lost batches) as errors that name the samples in flight."""

from __future__ import annotations

import re
from typing import Any

from ..datasets.waits import Interrupted
from .fetch import describe
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
        f"worker {b.worker} (pid {b.pid}){_state(b.pid, dead)} was loading sample {b.index} "
        f"({describe(dataset, b.index)}) for {b.seconds:.1f} s" + (": its batch is lost" if dead else "")
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
