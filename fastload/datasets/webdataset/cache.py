"""A bounded cache of whole shards on local disk, shared by every process of the machine.

Layout under the cache folder: ``shards/<digest>.tar`` (complete shards only),
``partial/<digest>.<pid>.<n>.<size>`` (downloads under way, each reserving its size), ``locks/<digest>.lock``. A
download holds the shard's lock (``flock``: released by the kernel if the process dies),
so one process downloads and the others wait and then find the file. A download is
renamed into ``shards/`` only when complete and of the expected size: a partial one
never enters the cache. Before a shard is added, the least recently used shards (by
mtime, touched on every use) are removed until it fits the size limit; a reader that
has the file open keeps reading it after its removal.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..partial import is_alive
from .index import ShardId

_counter = itertools.count()
_evicting = threading.Lock()  # threads of one process; processes use the .evict lock file


class CacheError(OSError):
    """The cache could not take a shard (disk full, unwritable folder); the shard is readable without it."""


class CacheFull(CacheError):
    """Every byte the limit allows is held by shards being downloaded now; the shard is read without the cache."""


@contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if needed), held for the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class ShardCache:
    """Whole shards in ``root``, at most ``limit`` bytes of them.

    Args:
        root: The cache folder (created).
        limit: Most bytes of complete shards kept; a shard larger than this is never cached.
    """

    def __init__(self, root: str, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"cache_limit must be a number of bytes >= 0, got {limit!r}")
        self.root, self.limit = os.path.abspath(root), limit

    def _dir(self, name: str) -> str:
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        return path

    def path(self, shard: ShardId) -> str:
        return os.path.join(self.root, "shards", shard.digest() + ".tar")

    def get(self, shard: ShardId) -> str | None:
        """The cached file of ``shard`` (marked as just used), or None."""
        path = self.path(shard)
        try:
            os.utime(path)
        except FileNotFoundError:
            return None
        return path

    def fits(self, shard: ShardId) -> bool:
        return shard.size <= self.limit

    def fill(self, shard: ShardId, write: Callable[[Callable[[bytes], None]], None]) -> str:
        """The cached file of ``shard``, downloaded by ``write(sink)`` unless already there.

        ``write`` passes every byte of the shard, in order, to ``sink``. Only one process of
        the machine runs it for a shard at a time; the others wait, then find the file.

        Raises:
            CacheError: The shard is larger than the limit, or writing it failed (disk
                full); nothing of it stays in the cache.
            Exception: Whatever ``write`` raised (the partial file is removed).
        """
        if not self.fits(shard):
            raise CacheError(f"{shard.url}: the shard's {shard.size} bytes exceed the cache limit of {self.limit}")
        try:
            lock = os.path.join(self._dir("locks"), shard.digest() + ".lock")
            partial = self._dir("partial")
            self._dir("shards")
        except OSError as e:
            raise CacheError(f"cannot use the shard cache {self.root}: {e}") from e
        with locked(lock):
            found = self.get(shard)
            if found is not None:
                return found
            tmp = self._reserve(shard, partial)
            try:
                with open(tmp, "wb") as f:

                    def sink(chunk: bytes) -> None:
                        try:
                            f.write(chunk)
                        except OSError as e:
                            raise CacheError(f"{shard.url}: writing to the shard cache {self.root} failed: {e}") from e

                    write(sink)
                    f.flush()
                got = os.path.getsize(tmp)
                if got != shard.size and not shard.gzipped:  # a gzip'd shard is cached decompressed
                    raise CacheError(f"{shard.url}: the download has {got} bytes, the shard {shard.size}; not cached")
                os.replace(tmp, self.path(shard))
            except OSError as e:
                if isinstance(e, CacheError) or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                    raise
                raise CacheError(f"{shard.url}: the shard cache {self.root} cannot take it: {e}") from e
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        return self.path(shard)

    def usage(self) -> int:
        """Bytes of complete shards in the cache."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[int, int, str]]:
        out = []
        with os.scandir(self._dir("shards")) as it:
            for entry in it:
                try:
                    st = entry.stat()
                except FileNotFoundError:  # removed by another process meanwhile
                    continue
                out.append((st.st_mtime_ns, st.st_size, entry.path))
        return out

    def _reserve(self, shard: ShardId, partial: str) -> str:
        """Makes room for ``shard`` beside the downloads under way (removing least recently used
        shards and dead processes' partial files) and creates its partial file, which reserves
        the room until it is renamed or removed.

        Raises:
            CacheFull: Downloads under way hold the room even with every shard removed.
        """
        with _evicting, locked(os.path.join(self.root, "locks", ".evict")):
            reserved = 0
            for name in os.listdir(partial):
                parts = name.split(".")
                if len(parts) != 4 or not (parts[1].isdigit() and parts[3].isdigit()):
                    continue
                if is_alive(int(parts[1]), None):
                    reserved += int(parts[3])
                    continue
                try:
                    os.remove(os.path.join(partial, name))
                except FileNotFoundError:
                    pass
            entries = sorted(self._entries())
            total = sum(size for _, size, _ in entries) + reserved
            for _, size, path in entries:
                if total + shard.size <= self.limit:
                    break
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
                total -= size
            if total + shard.size > self.limit:
                raise CacheFull(f"{shard.url}: downloads under way fill the shard cache {self.root}")
            tmp = os.path.join(partial, f"{shard.digest()}.{os.getpid()}.{next(_counter)}.{shard.size}")
            open(tmp, "wb").close()
            return tmp
