"""Worker failures (deaths, timeouts, lost batches) as errors that name the samples in flight."""

from __future__ import annotations

import re
from typing import Any

from .fetch import describe
from .inflight import InFlight


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
    """A worker death or timeout, with the sample(s) that were being loaded."""
    forget_frames(error)
    busy = inflight.busy()
    pids = pids_of(error)
    named = [b for b in busy if b.pid in pids] or busy
    where = "; ".join([f"worker {b.worker} (pid {b.pid}) was loading sample {b.index} "
                       f"({describe(dataset, b.index)}) for {b.seconds:.1f} s" for b in named]
                     + [u for u in inflight.unwell() if not any(f"(pid {b.pid})" in u for b in named)])
    lost = isinstance(error, (ConnectionError, EOFError))
    head = ("fastload: lost a DataLoader worker process or its batch (a crash: out of memory, "
            f"or a fault in a decoder?): {error!r}") if lost else f"fastload: {error}"
    return WorkerFailure(f"{head}; {where or 'no sample was in flight'}")
