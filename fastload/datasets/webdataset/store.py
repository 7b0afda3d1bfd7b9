"""Where a shard's index and bytes come from: a local file, the shard cache, or the network.

A shard is indexed once per machine and content (URL, size, version): a local file by
hopping from tar header to tar header, a remote one by scanning its headers while it
is downloaded, into the shard cache when there is one. The index is stored under the
index folder (``<digest>.npz``); later opens read only that and one metadata request.

A remote shard whose server sends neither ETag nor Last-Modified cannot be told from a
replaced one of the same size, so nothing of it outlives the dataset object: its version
is a token drawn when the dataset is made (:attr:`ShardStore.session`), its index is not
stored, and its cached copy serves only that dataset (and its workers); the next
dataset downloads it again, and least-recently-used eviction reclaims the old copy.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from .cache import CacheError, CacheFull, ShardCache
from .gz import file_chunks, gunzip
from .gz import span as gz_span
from .index import UNVALIDATED, ShardId, ShardIndex, group_members, load_index, save_index
from .remote import Remote, ShardChanged, is_url, local_path, same_local_file
from .tar import ShardError, file_source, iter_members


class _Tee:
    """A Source over streamed chunks that hands every chunk to ``sink`` as it arrives."""

    def __init__(self, chunks: Iterator[bytes], sink: Callable[[bytes], None]) -> None:
        self.chunks, self.sink = chunks, sink
        self.buf, self.pos = b"", 0

    def _next(self) -> bytes | None:
        chunk = next(self.chunks, None)
        if chunk is not None:
            self.sink(chunk)
        return chunk

    def read(self, n: int) -> bytes:
        while len(self.buf) - self.pos < n:
            chunk = self._next()
            if chunk is None:
                break
            self.buf, self.pos = self.buf[self.pos :] + chunk, 0
        out = self.buf[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def skip(self, n: int) -> None:
        have = len(self.buf) - self.pos
        if n <= have:
            self.pos += n
            return
        n -= have
        self.buf, self.pos = b"", 0
        while n > 0:
            chunk = self._next()
            if chunk is None:
                return
            if len(chunk) > n:
                self.buf, self.pos = chunk, n
                return
            n -= len(chunk)

    def drain(self) -> None:
        while self._next() is not None:
            pass


def _scan_file(path: str, shard: ShardId) -> ShardIndex:
    """The index of a local copy of ``shard``, read by jumping from tar header to tar header."""
    size = os.path.getsize(path) if shard.gzipped else shard.size  # a gzip'd shard's copy is decompressed
    with open(path, "rb") as f:
        return group_members(iter_members(file_source(f), shard.url, size), shard.url)


@dataclass
class ShardStore:
    """Indexes and bytes of shards.

    Attributes:
        remote: Network access (fsspec) and its retry policy.
        cache: The shard cache, or None to read remote shards straight from the network.
        index_dir: Where indexes are stored.
    """

    remote: Remote
    cache: ShardCache | None
    index_dir: str
    cache_failed: bool = field(default=False, repr=False)  # this process stops trying after a write failure
    session: str = field(default_factory=lambda: uuid.uuid4().hex)  # the version of shards without validators

    def _cache_for(self, shard: ShardId) -> ShardCache | None:
        return self.cache if self.cache is not None and self.cache.fits(shard) and not self.cache_failed else None

    def _cache_error(self, error: CacheError) -> None:
        self.cache_failed = True
        warnings.warn(
            f"fastload: {error}; this process reads shards without the cache from now on", RuntimeWarning, stacklevel=3
        )

    def identify(self, url: str) -> ShardId:
        shard = self.remote.identify(url)
        if is_url(shard.url) and not shard.version:
            shard = ShardId(shard.url, shard.size, UNVALIDATED + self.session)
        return shard

    def index(self, shard: ShardId, progress: Callable[[int], None] | None = None) -> ShardIndex:
        """The shard's index: the stored one, else built (and stored) now; ``progress(n)`` is
        told of every ``n`` bytes downloaded for it.

        Raises:
            FileNotFoundError, DownloadError: The shard cannot be read.
            ShardError: It is not a tar archive (its first header is bad).
        """
        path = os.path.join(self.index_dir, shard.digest() + ".npz")
        index = load_index(path, shard) if os.path.isfile(path) else None
        if index is not None:
            return index
        if is_url(shard.url) or shard.gzipped:
            index = self._download(shard, progress)
        else:
            index = _scan_file(local_path(shard.url), shard)
        if not shard.validated:
            return index  # its key is this dataset's alone: nobody would find it again
        try:
            save_index(path, index, shard)
        except OSError as e:  # costs a rescan next time, nothing else
            warnings.warn(
                f"fastload: cannot store the index of {shard.url} under {self.index_dir}: {e}",
                RuntimeWarning,
                stacklevel=2,
            )
        return index

    def index_current(
        self, shard: ShardId, progress: Callable[[int], None] | None = None, attempts: int = 3
    ) -> tuple[ShardId, ShardIndex]:
        """(the shard as the server holds it now, its index): a shard replaced while it
        downloads (:class:`.remote.ShardChanged`) is identified again and downloaded from its
        start, so its index, cached copy and version are all of one version.

        Raises:
            ShardChanged: It changed ``attempts`` times in a row.
            FileNotFoundError, DownloadError, ShardError: As :meth:`index`.
        """
        for attempt in range(attempts):
            try:
                return shard, self.index(shard, progress)
            except ShardChanged as e:
                if attempt == attempts - 1:
                    raise ShardChanged(
                        shard.url, e.offset, f"{e.problem}; it changed {attempts} times while downloading", e.version
                    ) from e
                warnings.warn(
                    f"fastload: {e}; downloading the new version from its start", RuntimeWarning, stacklevel=2
                )
                shard = self.identify(shard.url)
        raise AssertionError("unreachable")

    def _plain(self, shard: ShardId) -> Iterator[bytes]:
        """The shard's tar bytes, streamed (decompressed when it is gzip'd)."""
        raw = self.remote.stream(shard) if is_url(shard.url) else file_chunks(local_path(shard.url))
        return gunzip(raw, shard.url) if shard.gzipped else raw

    def _scan(self, shard: ShardId, sink: Callable[[bytes], None]) -> ShardIndex:
        tee = _Tee(self._plain(shard), sink)
        index = group_members(iter_members(tee, shard.url, None if shard.gzipped else shard.size), shard.url)
        tee.drain()
        return index

    def _download(self, shard: ShardId, progress: Callable[[int], None] | None = None) -> ShardIndex:
        """Scans the shard while it downloads, into the cache when it can take it; a copy that
        another process put in the cache meanwhile is scanned instead of downloading again."""
        found: list[ShardIndex] = []

        def write(sink: Callable[[bytes], None]) -> None:
            def counted(chunk: bytes) -> None:
                sink(chunk)
                if progress is not None:
                    progress(len(chunk))

            found.append(self._scan(shard, counted))

        cache = self._cache_for(shard)
        if cache is not None:
            try:
                path = cache.fill(shard, write)
            except CacheFull:
                pass
            except CacheError as e:
                self._cache_error(e)
            else:
                if not found:
                    return _scan_file(path, shard)
        if not found:
            write(lambda chunk: None)
        return found[0]

    def local_file(self, shard: ShardId) -> str | None:
        """A local file holding the shard: the shard itself, or its cached download (made now
        when missing); None when it is remote and cannot be cached.

        The download is checked by its size only: the shard's URL, size and version
        (ETag / Last-Modified) were fixed when it was indexed, and its bytes are not
        scanned again.
        """
        if not is_url(shard.url) and not shard.gzipped:
            return local_path(shard.url)
        cache = self._cache_for(shard)
        if cache is None:
            return None
        found = cache.get(shard)
        if found is not None:
            return found
        try:
            return cache.fill(shard, lambda sink: self._copy(shard, sink))
        except CacheFull:
            return None
        except CacheError as e:
            self._cache_error(e)
            return None

    def open_local(self, shard: ShardId) -> BinaryIO | None:
        """:meth:`local_file`, opened; None where there is none. A local shard is checked to be
        the version it was indexed as: one replaced or rewritten since is not read with the
        old index (the dataset would hand out other samples under its keys, or fail on them,
        differently in each process).

        Raises:
            ShardError: The local shard changed since it was indexed.
        """
        path = self.local_file(shard)
        if path is None:
            return None
        f = open(path, "rb")
        if not is_url(shard.url) and not shard.gzipped:
            if not same_local_file(shard, os.fstat(f.fileno())):
                f.close()
                raise ShardError(
                    shard.url,
                    None,
                    "the shard changed since the dataset indexed it (its size, modification time or inode "
                    "differ: replaced or rewritten); its samples are not read with the old index: open the "
                    "dataset again",
                )
        return f

    def _copy(self, shard: ShardId, sink: Callable[[bytes], None]) -> None:
        for chunk in self._plain(shard):
            sink(chunk)

    def span(self, shard: ShardId, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end - 1`` of a shard not in the cache: a ranged read from the
        network, or of a gzip'd one, its stream decompressed from the start up to ``end``."""
        if shard.gzipped:
            return gz_span(self._plain(shard), start, end)
        return self.remote.read(shard, start, end)
