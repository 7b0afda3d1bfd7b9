"""This process's LMDB guards (:mod:`.lmdb_guard`): one per LMDB path, shared by its datasets.

A dataset made again after its file was replaced ends the guard of the old file for good:
the old dataset's reads, also one in progress, raise LMDBChangedError. A forked child
starts its own (the key holds the pid), and the guards end at exit.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from .lmdb_guard import Guard
from .lmdb_size import DataFile, check_still_whole


def _one_file(a: DataFile | None, b: DataFile | None) -> bool:
    """Whether datasets that opened ``a`` and ``b`` read one file and may share a guard: the
    file as both saw it, or, where both let writers commit (``lock=True``), the same inode."""
    if a is None or b is None:
        return True
    if a.writers and b.writers:
        return (a.device, a.inode) == (b.device, b.inode)
    return a.same_file(b)


_guards: dict[tuple[str, int], Guard] = {}
_guards_lock = threading.Lock()


def guard_for(path: str, options: dict[str, Any], data: DataFile | None) -> Guard:
    """This process's guard of the LMDB at ``path`` (one per path, shared by its datasets).

    A guard of the file as another dataset saw it before it changed is ended for good
    (that dataset's reads, also one in progress, raise LMDBChangedError).

    Raises:
        LMDBChangedError, ValueError: ``data``'s file was replaced, written to or cut short
            (checked first, so a dataset of an older file never ends the current guard).
    """
    check_still_whole(data)
    key = (os.path.realpath(path), os.getpid())
    with _guards_lock:
        guard = _guards.get(key)
        if guard is not None and _one_file(guard.data, data):
            return guard
        stale, guard = guard, Guard(path, options, data)
        _guards[key] = guard
    if stale is not None:
        stale.end()
    return guard


@atexit.register
def _close_all() -> None:
    """Ends this process's guards at exit (each would end on EOF anyway; this waits for them)."""
    with _guards_lock:
        mine = [g for (_, pid), g in _guards.items() if pid == os.getpid()]
        _guards.clear()
    for guard in mine:
        guard.end()
