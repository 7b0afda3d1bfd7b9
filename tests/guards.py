"""Test helper: end this process's LMDB guard of a path, so that the next read starts another.

Not part of the package: no program needs it (a guard ends at exit, or when a dataset made
again finds its file replaced)."""

import os

from fastload.datasets import lmdb_guard_registry


def close_guard(path: str) -> None:
    """Ends this process's guard of the LMDB at ``path``."""
    with lmdb_guard_registry._guards_lock:
        guard = lmdb_guard_registry._guards.pop((os.path.realpath(path), os.getpid()), None)
    if guard is not None:
        guard.end()
