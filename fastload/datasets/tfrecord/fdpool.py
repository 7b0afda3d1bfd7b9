"""A bounded set of open file descriptors, shared by threads, reopened in forked children.

One descriptor per shard does not scale: TensorFlow's ImageNet layout has 1024 shards,
and every worker process holding all of them fails with EMFILE under ``ulimit -n 1024``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

from .framing import TFRecordError

MAX_OPEN_FILES = 64

_pools: weakref.WeakSet = weakref.WeakSet()


def stamp(st: os.stat_result) -> tuple[int, int, int]:
    """What tells a file's content changed: size, modification time and inode (a copy that keeps
    the time, or a file written anew and renamed into place, changes the inode)."""
    return st.st_size, st.st_mtime_ns, st.st_ino


class FilePool:
    """Read-only descriptors for ``files``, at most ``limit`` open at once (least recently used closed).

    A descriptor in use by one thread is never closed under it by another; when all are in
    use the pool goes over the limit until they are released, then closes the extra ones.

    Args:
        files: The paths, indexed by file id.
        limit: Most descriptors kept open.
        stamps: Each file's :func:`stamp` when it was indexed: a file opened with another (replaced
            or rewritten since) is a TFRecordError, not read with the old index (None: not checked).
    """

    def __init__(
        self, files: Sequence[str], limit: int = MAX_OPEN_FILES, stamps: Sequence[tuple[int, ...]] | None = None
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"max_open_files must be an int, got {limit!r}")
        if limit < 1:
            raise ValueError(f"max_open_files must be at least 1, got {limit}")
        self.files, self.limit, self.stamps = files, limit, stamps
        self._lock = threading.Lock()
        self._open: OrderedDict[int, list[int]] = OrderedDict()  # file id -> [fd, users]
        _pools.add(self)

    def pread(self, file_id: int, length: int, offset: int) -> bytes:
        """``length`` bytes at ``offset`` of file ``file_id`` (fewer at its end)."""
        fd = self._acquire(file_id)
        try:
            return os.pread(fd, length, offset)
        finally:
            with self._lock:
                self._open[file_id][1] -= 1
                if len(self._open) > self.limit:  # back under the limit once the rush is over
                    self._evict(self.limit)

    def _acquire(self, file_id: int) -> int:
        with self._lock:
            entry = self._open.get(file_id)
            if entry is None:
                self._evict(self.limit - 1)
                entry = self._open[file_id] = [self._checked(file_id), 0]
            else:
                self._open.move_to_end(file_id)
            entry[1] += 1
            return entry[0]

    def _checked(self, file_id: int) -> int:
        """A new descriptor of file ``file_id``, the file the index was made of."""
        fd = os.open(self.files[file_id], os.O_RDONLY | os.O_CLOEXEC)
        if self.stamps is not None and stamp(os.fstat(fd)) != tuple(self.stamps[file_id]):
            os.close(fd)
            raise TFRecordError(
                self.files[file_id],
                None,
                "the file changed since the dataset indexed it (its size, modification time or inode differ: "
                "replaced or rewritten); its records are not read with the old index: open the dataset again",
            )
        return fd

    def _evict(self, keep: int) -> None:
        idle = [file_id for file_id, (_, users) in self._open.items() if users == 0]
        for file_id in idle[: max(0, len(self._open) - keep)]:
            os.close(self._open.pop(file_id)[0])

    def close(self) -> None:
        """Closes every idle descriptor."""
        with self._lock:
            self._evict(0)

    def _forget_inherited(self) -> None:
        # Runs in a fork child before anything else: the parent's descriptors share file
        # offsets and the parent's lock may have been held by a thread that is not here.
        for fd, _ in self._open.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._open = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"files": self.files, "limit": self.limit, "stamps": self.stamps}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["files"], state["limit"], state.get("stamps"))

    def __del__(self) -> None:
        try:
            for fd, _ in self._open.values():
                os.close(fd)
        except Exception:
            pass


def _after_fork_in_child() -> None:
    for pool in list(_pools):
        pool._forget_inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)
