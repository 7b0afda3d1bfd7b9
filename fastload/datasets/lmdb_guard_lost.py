"""What ended an LMDB guard process mid-request, in words, and whether a new guard may well
read it (see :mod:`.lmdb_guard`).

A guard dies by a signal its read brought on (a wild pointer into a damaged page, a page
past the end of a shrunk file: the file is at fault), by one sent from outside (SIGKILL from
the out-of-memory killer, SIGTERM: the file is not), or hangs (stopped, stuck on a dead
network mount). Only the first is told as a damaged file.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from .lmdb_lock import lock_file_path
from .lmdb_size import DataFile, LMDBChangedError, check_still_whole

# Signals a read brings on itself; any other came from outside and says nothing about the file.
FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


class Lost(Exception):
    """How a guard ended or hung mid-request (the message); ``again``: a new guard may well
    read it (it was killed from outside, or hung)."""

    def __init__(self, message: str, again: bool) -> None:
        super().__init__(message)
        self.again = again


def how_lost(pid: int, code: int | None, state: str, hung: bool, what: str, timeout: float, cause: str) -> Lost:
    """Says what happened to guard ``pid``.

    Args:
        pid, code: The guard and its exit code (negative: the signal; None: it did not end).
        state: What /proc said it was doing (for a hung one).
        hung: It did not answer within ``timeout`` seconds (and was killed).
        what: The request ("reading key b'1'").
        cause: Why the file killed it, for a death by a signal in :data:`FAULTS` (see :func:`cause_of`).
    """
    if hung:
        why = " (SIGSTOP, a debugger or job control)" if state.startswith("stopped") else ""
        return Lost(
            f"the guard process (pid {pid}) did not answer within {timeout:g} s {what}: it was {state}{why}; "
            "it was killed",
            True,
        )
    if code is None:  # killed, and still in uninterruptible I/O
        return Lost(f"the guard process (pid {pid}) stopped answering {what} and does not end", False)
    if code >= 0:
        return Lost(f"the guard process (pid {pid}) exited with status {code} {what}", False)
    sig = signal.Signals(-code)
    if sig not in FAULTS:
        return Lost(
            f"the guard process (pid {pid}) was killed by signal {sig.name} {what}, from outside: the file "
            "is not at fault (the kernel's out-of-memory killer sends SIGKILL: see `dmesg`)",
            True,
        )
    return Lost(f"the guard process reading it died by signal {sig.name} {what}; {cause}", False)


def cause_of(sig: signal.Signals, path: str, options: dict[str, Any], data: DataFile | None) -> str:
    """Why a read killed the guard with ``sig``: the file changed, a full disk under the lock
    file, or damage."""
    try:
        check_still_whole(data)
    except LMDBChangedError as e:
        return f"{e}. The training process is unaffected"
    except ValueError as e:
        return f"its data file shrank while in use: {e}. The training process is unaffected"
    if sig == signal.SIGBUS and options.get("lock", True):
        lock = lock_file_path(path)
        try:
            full = os.statvfs(os.path.dirname(lock) or ".").f_bavail == 0
        except OSError:
            full = False
        if full:
            return (
                f"the disk of its lock file {lock} is full (lmdb writes its reader table there through a "
                "map: SIGBUS). Free some space, or open it with lock=False"
            )
    return (
        "its data file is damaged (a B-tree page that does not hold together). The training process "
        "is unaffected; copy or convert the LMDB again"
    )
