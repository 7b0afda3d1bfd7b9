"""Forked workers that never start: found as a pass starts, so that new ones replace them.

A child forked while another thread of the parent holds a lock it needs right after the fork
waits for that lock for ever, before it runs a line of Python. CPython before 3.11.10 is one
such case (python/cpython#112275): the child takes the interpreter's thread-state lock again
before resetting it, so a fork made while another thread holds that lock without the GIL
leaves a worker stuck. A C++ thread entering Python does: torch.distributed's gloo thread
(``pt_gloo_runloop``), ending an ``all_reduce``, drops its tensors' Python objects and so
creates a thread state (gdb: ``ProcessGroupGloo::runLoop`` -> ``~AsyncWork`` ->
``decref_pyobject`` -> ``gil_scoped_acquire`` -> ``PyThreadState_New``). DataLoader would
then wait on the stuck worker for ever: it is alive, and none of its batches comes (with
``timeout=0``, DataLoader's and the Loader's default).

A worker registers in the in-flight table before it loads anything (in
:func:`~.workers.worker_init`, after torch's worker set-up), and the table counts
registrations per worker (:meth:`~.inflight.InFlight.starts`). A pass that forked new
workers waits for each count to move (a fraction of a second), at most :data:`STARTUP_S`
(or the Loader's shorter ``timeout``); a worker still not started then is stuck
(:class:`Starting`). Nothing of the pass has reached the consumer yet, so the caller can
replace the workers and start the pass again, losing nothing and repeating nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

from .closing import running
from .inflight import InFlight
from .waiting import Stop, wait_until

#: How long a forked worker may take to register (normally well under a second; a loaded
#: machine, or a slow ``os.register_at_fork`` hook of another library, takes longer).
STARTUP_S = 30.0
#: Starts of one pass that may end with a worker stuck before the pass fails.
START_TRIES = 3
_POLL_S = 0.005

# python/cpython#112275 is fixed from 3.11.10 on (3.12 never had it).
KNOWN_DEADLOCK = sys.version_info < (3, 11, 10)


def _children() -> set[int]:
    """The child processes this thread started (Linux lists them by thread); none where the
    kernel does not list them."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/children") as f:
            return {int(pid) for pid in f.read().split()}
    except (OSError, ValueError):
        return set()


def _another_program(pid: int) -> bool:
    """Whether ``pid`` runs another program than this process: a helper it executed, not a
    fork of it (one that exited, its program no longer readable, is a fork that died)."""
    try:
        return os.readlink(f"/proc/{pid}/exe") != os.readlink("/proc/self/exe")
    except OSError:
        return False


@dataclass(frozen=True)
class Stuck:
    """The workers of a start that never started.

    Attributes:
        workers: Their worker numbers.
        pids: Their processes, where this thread's children are listed (else empty: they are
            ended with the rest of their DataLoader).
        limit: The seconds they were given.
    """

    workers: tuple[int, ...]
    pids: tuple[int, ...]
    limit: float

    def message(self) -> str:
        """The warning's text: what was seen, and why it can happen."""
        who = ", ".join(map(str, self.workers))
        pids = f" (pid {', '.join(map(str, self.pids))})" if self.pids else ""
        why = ""
        if KNOWN_DEADLOCK:
            why = (
                f"; on Python {sys.version.split()[0]}, a child forked while another thread creates its Python "
                "thread state can deadlock before it runs (python/cpython#112275, fixed in 3.11.10)"
            )
        return f"fastload: worker process(es) {who}{pids} did not start within {self.limit:g} s of their fork{why}"


class Starting:
    """A start of new workers by a fork, seen from before it: call :meth:`stuck` after it.

    Args:
        inflight: The workers' in-flight table (each worker registers there as it starts).
        workers: How many are started.
    """

    def __init__(self, inflight: InFlight, workers: int) -> None:
        self.inflight, self.workers = inflight, workers
        self._starts = inflight.starts()
        self._children = _children()

    def _waiting(self) -> list[int]:
        """The workers whose registrations have not moved since the start began."""
        moved = self.inflight.starts() != self._starts
        return [w for w in range(self.workers) if not moved[w]]

    def forked(self) -> list[int]:
        """This thread's children forked since (the new workers, also those that died)."""
        return [pid for pid in _children() - self._children if not _another_program(pid)]

    def unstarted(self) -> list[int]:
        """The pids of the new workers that have not registered (stuck, or dead before)."""
        started = set(self.inflight.started_since(self._starts).values())
        return [pid for pid in self.forked() if pid not in started]

    def stuck(self, closed: threading.Event, limit: float) -> Stuck | None:
        """Waits until every worker has started (None back), or ``limit`` seconds: those not
        started then are stuck.

        A new worker that is no longer running ends the wait (None): it died as it started, and
        the pass reports its death. Where no child was forked (this kernel lists no children,
        or the start forked none), nothing is waited for.

        Raises:
            PassClosed: ``closed`` was set meanwhile.
        """
        new = self.forked()
        if not new:
            return None

        def ready(seconds: float) -> bool:
            until = time.monotonic() + seconds
            while self._waiting():
                if len(running(new)) < len(new):
                    return True
                if time.monotonic() >= until:
                    return False
                time.sleep(_POLL_S)
            return True

        try:
            wait_until(ready, Stop(closed), time.monotonic() + limit, TimeoutError)
            return None
        except TimeoutError:
            pass
        waiting = self._waiting()
        if not waiting or len(running(new)) < len(new):
            return None
        return Stuck(tuple(waiting), tuple(self.unstarted()), limit)
