"""Worker deaths reported where the consumer asks for a batch, not inside the training step.

torch's DataLoader installs a SIGCHLD handler that raises ``RuntimeError: DataLoader worker
(pid N) is killed by signal`` wherever the main thread happens to be: inside the user's
own training step, naming no sample, and also for the workers of a loader that is being
shut down. fastload wraps that handler (in the main thread only, keeping it as the one it
calls): a death of a fastload worker is kept until the consumer's next ``next()``, where
it becomes an error naming the samples in flight; a death of a worker fastload already
retired is dropped; anything else (the user's own DataLoaders) is raised as torch raises it.
Whose death it is is read from the processes (their state in ``/proc``), never from the
error's text.
"""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from .inflight import InFlight, process_state

_RETIRED_KEPT = 4096

_tables: weakref.WeakSet = weakref.WeakSet()  # in-flight tables of the running sources
_retired: deque[int] = deque(maxlen=_RETIRED_KEPT)
_pending: list[tuple[frozenset[int], RuntimeError]] = []
_waiting: list[InFlight] = []  # the tables whose pass the main thread waits on inside a fastload next()
_handlers: weakref.WeakSet = weakref.WeakSet()  # the SIGCHLD handlers fastload installed
_starting = [0]  # starts of fastload workers under way (DataLoader forking them), in any thread


def _wrap(previous: Any) -> Any:
    def on_child(signum: int, frame: Any) -> None:
        try:
            if callable(previous):
                previous(signum, frame)
        except RuntimeError as e:
            # Whose death torch's handler raised for is read from the processes, not its text:
            # torch leaves a dead worker a zombie until it joins it.
            pids = frozenset(pid for table in list(_tables) for pid in dead(table))
            if pids:
                if any(dead(table) for table in _waiting):
                    raise  # out of the consumer's next(), which names the samples
                # Another loader's worker (idle persistent workers die too): its next pass says so.
                _pending.append((pids, e))
            elif _starting[0]:
                pass  # a worker that died as workers start: DataLoader's own check reports it at the first batch
            elif _dead_children() - set(_retired):
                raise  # a death of another child: the user's own DataLoader's worker
            # else a retired worker's (or one joined since: torch's own check then sees it)

    _handlers.add(on_child)
    return on_child


def _dead_children() -> set[int]:
    """This process's children that died (killed, or exited with an error) and are not yet
    joined (zombies): those torch's handler raises for. One that exited cleanly (a worker
    that ended as asked) is none of them."""
    me, pids = str(os.getpid()), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # fields[0]: the state; [1]: the parent; [49]: the wait status (Linux 3.5 on).
            if len(fields) > 1 and fields[1] == me and fields[0] in ("Z", "X"):
                if len(fields) < 50 or fields[49] != "0":
                    pids.add(int(entry))
    return pids


def watch(table: InFlight) -> None:
    """Reports deaths of the workers registered in ``table`` through :func:`check`; call
    after the workers started (DataLoader installs its handler then)."""
    _tables.add(table)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    current = signal.getsignal(signal.SIGCHLD)
    if current not in _handlers:
        signal.signal(signal.SIGCHLD, _wrap(current))


def retire(table: InFlight) -> None:
    """The workers in ``table`` are being shut down: their deaths are no longer errors.

    Workers that are stopped (SIGSTOP) would never get to exit: they are killed."""
    pids = table.pids()
    retire_pids(pids.values())
    _tables.discard(table)
    kill_children(pid for pid in pids.values() if process_state(pid).startswith("stopped"))


def retire_pids(pids: Iterable[int]) -> None:
    """The processes ``pids`` (workers, registered in no table) are being ended on purpose:
    their deaths are no longer errors."""
    _retired.extend(pids)
    _pending[:] = [(p, e) for p, e in _pending if not p <= set(_retired)]


def dead(table: InFlight) -> frozenset[int]:
    """The worker processes registered in ``table`` that have exited (dead, a zombie, gone),
    other than those retired (shut down on purpose): read from the processes, not from an
    error's text."""
    return frozenset(
        pid
        for pid in table.pids().values()
        if process_state(pid) in ("gone", "dead", "dead (zombie)") and pid not in _retired
    )


def kill_children(pids: Iterable[int]) -> None:
    """SIGKILLs those of ``pids`` that are this process's children, or its children's (workers
    started by a forkserver). Through a pidfd where there is one: a pid reaped and reused since
    is never signalled."""
    me = os.getpid()
    for pid in pids:
        try:
            handle = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        except OSError:
            continue  # gone already
        try:
            parent = _parent(pid)
            if me in (parent, _parent(parent)):
                if handle is not None:
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass  # gone meanwhile
        finally:
            if handle is not None:
                os.close(handle)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def check(table: InFlight) -> None:
    """Raises the death of one of ``table``'s workers that happened outside ``next()``."""
    mine = set(table.pids().values())
    for i, (pids, error) in enumerate(_pending):
        if pids & mine:
            del _pending[i]
            raise error


@contextmanager
def starting() -> Iterator[None]:
    """Context: fastload workers are being started (DataLoader's ``iter()`` forks them). A
    child's death meanwhile is not raised there: torch's handler would raise it wherever the
    main thread is, such as inside threading's own bookkeeping as DataLoader starts its queue
    threads (a ``KeyError`` on a Thread later). DataLoader's own check of its workers reports it
    at the pass's first batch, as a worker death."""
    _starting[0] += 1
    try:
        yield
    finally:
        _starting[0] -= 1


@contextmanager
def waiting(table: InFlight) -> Iterator[None]:
    """Context: the consumer waits inside a fastload ``next()`` on the workers of ``table``
    (their deaths raise right there; another loader's are kept for its own next pass). The
    table leaves the waiting list however the wait ends, a death raised while it enters too."""
    main = threading.current_thread() is threading.main_thread()
    try:
        if main:
            _waiting.append(table)
        yield
    finally:
        if main and table in _waiting:
            _waiting.remove(table)


def _forked() -> None:
    """In a forked child (``os.fork``): the running sources' workers are the parent's, and so
    are their deaths. multiprocessing still lists the parent's child processes as this one's,
    and at its exit would SIGTERM them (the parent's workers, also those still starting) and
    then fail to join them. Where fastload workers run, it forgets them here, as
    multiprocessing does in the processes it forks itself."""
    if not _tables:
        return
    _tables.clear()
    _pending.clear()
    # No public API reaches this set (multiprocessing's own forks empty it as here).
    multiprocessing.process._children.clear()  # type: ignore[attr-defined]


os.register_at_fork(after_in_child=_forked)
