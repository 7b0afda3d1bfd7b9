"""One slot's reads: chunk by chunk, the shards fetched ahead in a background thread.

A chunk is a run of the slot's samples that needs at most a window of shards. Preparing
it opens each of its shards as a local file (the shard itself, or its copy in the shard
cache, downloaded now if missing), or, without a cache, reads the byte span of the
chunk's members of each shard into memory with one ranged request. One background
thread prepares the chunk being read and then ``ahead`` more, shard by shard in the
order they are first needed; a read waits only for its own shard, so downloads overlap
decoding. A shard that cannot be read makes every read of it fail with the error that
names its URL and byte offset.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .tar import ShardError

MAX_MEMBER_BYTES = 1 << 30  # an image or target larger than this is corruption, not data


class Prepared:
    """The shards of one chunk as the background thread gets to them: an open file, an
    in-memory span (first byte, bytes), or the error that keeps it from being read."""

    def __init__(self, shards: list[int]) -> None:
        self.order = shards
        self._ready = {s: threading.Event() for s in shards}
        self._lock = threading.Lock()
        self.closed = False
        self.files: dict[int, Any] = {}
        self.spans: dict[int, tuple[int, bytes]] = {}
        self.errors: dict[int, Exception] = {}

    def put(
        self, shard: int, *, file: Any = None, span: tuple[int, bytes] | None = None, error: Exception | None = None
    ) -> None:
        with self._lock:
            if self.closed:
                if file is not None:
                    file.close()
                return
            if file is not None:
                self.files[shard] = file
            elif span is not None:
                self.spans[shard] = span
            else:
                self.errors[shard] = error
        self._ready[shard].set()

    def wait(self, shard: int) -> None:
        self._ready[shard].wait()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for f in self.files.values():
                f.close()
            self.files, self.spans = {}, {}
        for event in self._ready.values():  # nobody waits on a closed chunk
            event.set()


class SlotReader:
    """Reads the members of one slot's samples, chunk by chunk.

    Args:
        table: The dataset's sample table (shard, offsets and sizes of each sample).
        store: Where shard bytes come from.
        chunks: The slot's sample numbers, in reading order, cut into chunks.
        ahead: Chunks prepared in the background beyond the one being read.
    """

    def __init__(self, table: Any, store: Any, chunks: list[np.ndarray], ahead: int) -> None:
        self.table, self.store, self.chunks, self.ahead = table, store, chunks, ahead
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, Prepared] = {}
        self._current, self._prepared = -1, Prepared([])

    def _fill(self, k: int, prepared: Prepared) -> None:
        numbers = self.chunks[k]
        shards = self.table.shard.array[numbers]
        for shard in prepared.order:
            if prepared.closed:
                return
            try:
                file = self.store.open_local(self.table.shards[shard])
                if file is not None:
                    prepared.put(shard, file=file)
                    continue
                lo, hi = self.table.span(numbers[shards == shard])
                prepared.put(shard, span=(lo, self.store.span(self.table.shards[shard], lo, hi)))
            except Exception as e:
                prepared.put(shard, error=e)

    def _schedule(self, k: int) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="fastload-shards")
        for j in range(k, min(len(self.chunks), k + 1 + self.ahead)):
            if j not in self._pending:
                order = list(dict.fromkeys(self.table.shard.array[self.chunks[j]].tolist()))
                self._pending[j] = prepared = Prepared(order)
                self._pool.submit(self._fill, j, prepared)

    def _enter(self, k: int) -> None:
        self._prepared.close()
        for j in [j for j in self._pending if j < k]:  # skipped over: stop fetching for them
            self._pending.pop(j).close()
        self._schedule(k)
        self._prepared, self._current = self._pending.pop(k), k

    def read(self, chunk: int, number: int, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of the shard of sample ``number`` (in chunk ``chunk``).

        Raises:
            ShardError, DownloadError, FileNotFoundError: The shard or member cannot be read
                (the message names the URL and byte offset).
        """
        if chunk != self._current:
            self._enter(chunk)
        shard = int(self.table.shard.array[number])
        url = self.table.shards[shard].url
        if size > MAX_MEMBER_BYTES:
            raise ShardError(url, offset, f"a member of {size} bytes (the limit is {MAX_MEMBER_BYTES})")
        prepared = self._prepared
        prepared.wait(shard)
        if shard in prepared.errors:
            raise prepared.errors[shard]
        if shard in prepared.files:
            data = os.pread(prepared.files[shard].fileno(), size, offset)
        else:
            lo, span = prepared.spans[shard]
            data = span[offset - lo : offset - lo + size]
        if len(data) != size:
            raise ShardError(
                url,
                offset + len(data),
                f"the member at byte {offset} needs {size} bytes, the "
                f"shard has {len(data)} of them (truncated since indexed?)",
            )
        return data

    def close(self) -> None:
        for prepared in self._pending.values():
            prepared.close()
        self._pending = {}
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._prepared.close()
