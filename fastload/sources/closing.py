"""One close for a source's DataLoader workers, written once: a pass ends, and its workers stop, for certain.

Every way a pass of worker processes ends goes through :func:`end_workers`: the pass run to
its end or broken off, a worker failure's restart, and ``close()`` from any thread
(:func:`close_workers`, which the process source and the stream source both call). DataLoader
has no public shutdown: dropping the last reference to it (or to its iterator) asks the
workers to exit and joins them, waiting 5 s for each one stuck in a sample; a stopped
worker (SIGSTOP) never exits. So the references are dropped in the background, the workers
get :data:`GRACE_S` to exit their own way, and those still running then are killed.

A consumer blocked in ``next()`` on the workers is woken by the closed event
:func:`close_workers` sets: DataLoader waits for a batch in ticks of at most :data:`TICK_S`
(its ``timeout``, see :func:`wait_tick`), and between two ticks the pass looks at the event
(:class:`fastload.sources.worker_loader.PassWait`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable

from ..system import process_state
from . import deaths
from .inflight import InFlight

TICK_S = 0.25  # the longest DataLoader waits for a batch before the pass looks at its closed event
GRACE_S = 1.0  # workers asked to exit get this long to do so; those still running are killed
_POLL_S = 0.02  # how often the grace looks at the workers
_ENDED = ("gone", "dead", "dead (zombie)")  # an exited worker stays a zombie until torch joins it


def wait_tick(timeout: float) -> float:
    """DataLoader's ``timeout`` for workers that a pass with the Loader's ``timeout`` (0: none)
    waits on: the pass times out itself, and wakes at least every :data:`TICK_S`."""
    return min(TICK_S, timeout) if timeout > 0 else TICK_S


def running(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` that have not exited (stopped ones included)."""
    return [pid for pid in pids if process_state(pid) not in _ENDED]


def drop_in_background(holder: list) -> threading.Event:
    """Drops the references in ``holder`` (a DataLoader, its iterator) on a thread of its own:
    torch's shutdown then asks the workers to exit and joins them there. Returns an event set
    once they are dropped.

    The thread is not a daemon: the interpreter joins it before it finalizes. What it frees
    includes tensors (batches that arrived out of order, over worker buffers), and a daemon
    thread freeing a tensor while the interpreter finalizes aborts the process (torch retakes
    the GIL inside a destructor, CPython ends the thread there: "terminate called without an
    active exception"). Where a thread started now would not be joined (threading's shutdown
    has run: atexit handlers, finalization), the references are dropped here instead.
    """
    dropped = threading.Event()
    if sys.is_finalizing() or not threading.main_thread().is_alive():
        holder.clear()
        dropped.set()
        return dropped

    def drop() -> None:
        holder.clear()
        dropped.set()

    threading.Thread(target=drop, name="fastload-shutdown").start()
    return dropped


def end_workers(holder: list, workers: Iterable[int] = (), grace_s: float = GRACE_S) -> None:
    """Drops ``holder``'s references in the background; waits up to ``grace_s`` for the drop
    and for the processes ``workers`` (the DataLoader's) to exit, and kills those still running.

    Both are waited for: the drop may be instant while the workers are not asked to exit yet
    (a pass in another thread still holds the iterator; it lets go within a tick of ``close()``),
    and the workers may be gone while the drop's thread still runs.

    Args:
        holder: The last references to a DataLoader or its iterator (emptied).
        workers: The pids to end; none: the references are only dropped (persistent workers
            that stay for the next pass, or workers another call ends).
        grace_s: How long the drop and the workers may take; 0: the workers are killed at once.
    """
    workers = list(workers)  # read now: the drop may forget them
    dropped = drop_in_background(holder)
    deadline = time.monotonic() + grace_s
    left = running(workers)
    while (left or not dropped.is_set()) and time.monotonic() < deadline:
        if dropped.is_set():
            time.sleep(_POLL_S)
        else:
            dropped.wait(_POLL_S)
        left = running(left)
    if left:
        deaths.kill_children(left)


def close_workers(closed: threading.Event, inflight: InFlight, holder: list) -> None:
    """``close()`` of a source's workers, from any thread: the pass under way ends and the
    workers stop, within about :data:`GRACE_S`.

    ``closed`` is set first (a consumer waiting on the workers raises the closed error within
    a tick and drops its iterator), then the workers in ``inflight`` are retired (their deaths
    are no longer errors; stopped ones are killed at once), ``holder`` (the source's own
    references) is dropped and the workers still running after the grace are killed.
    """
    closed.set()
    pids = list(inflight.pids().values())
    deaths.retire(inflight)
    end_workers(holder, pids)
