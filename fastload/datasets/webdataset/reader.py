"""One slot's reads: chunk by chunk, the next chunks' shards fetched in a background thread.

A chunk is a run of the slot's samples that needs at most a window of shards. Preparing
it opens each of its shards as a local file (the shard itself, or its copy in the shard
cache, downloaded now if missing), or, without a cache, reads the byte span of the
chunk's members of each shard into memory with one ranged request. While the worker
decodes chunk ``c``, a background thread prepares chunks ``c + 1 .. c + ahead``, so
downloads overlap decoding. A shard that cannot be read makes every read of it fail
with the error that names its URL and byte offset.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .tar import ShardError

MAX_MEMBER_BYTES = 1 << 30  # an image or target larger than this is corruption, not data


@dataclass
class Prepared:
    """The shards of one chunk, ready to read: open files, in-memory spans, or why not."""

    files: dict[int, Any] = field(default_factory=dict)
    spans: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    errors: dict[int, Exception] = field(default_factory=dict)

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files, self.spans = {}, {}


def _close_when_done(future: Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


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
        self._pending: dict[int, Future] = {}
        self._current, self._prepared = -1, Prepared()

    def prepare(self, k: int) -> Prepared:
        """Opens or fetches every shard that chunk ``k`` reads from."""
        numbers = self.chunks[k]
        shards = self.table.shard.array[numbers]
        out = Prepared()
        for shard in dict.fromkeys(shards.tolist()):
            try:
                path = self.store.local_file(self.table.shards[shard])
                if path is not None:
                    out.files[shard] = open(path, "rb")
                    continue
                mine = numbers[shards == shard]
                lo, hi = self.table.span(mine)
                out.spans[shard] = (lo, self.store.span(self.table.shards[shard], lo, hi))
            except Exception as e:
                out.errors[shard] = e
        return out

    def _schedule(self, k: int) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="fastload-shards")
        for j in range(k + 1, min(len(self.chunks), k + 1 + self.ahead)):
            if j not in self._pending:
                self._pending[j] = self._pool.submit(self.prepare, j)

    def _enter(self, k: int) -> None:
        self._prepared.close()
        future = self._pending.pop(k, None)
        for j in [j for j in self._pending if j < k]:  # skipped over: close what they opened
            self._pending.pop(j).add_done_callback(_close_when_done)
        self._prepared = future.result() if future is not None else self.prepare(k)
        self._current = k
        if self.ahead:
            self._schedule(k)

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
        if shard in prepared.errors:
            raise prepared.errors[shard]
        if shard in prepared.files:
            data = os.pread(prepared.files[shard].fileno(), size, offset)
        else:
            lo, span = prepared.spans[shard]
            data = span[offset - lo:offset - lo + size]
        if len(data) != size:
            raise ShardError(url, offset + len(data), f"the member at byte {offset} needs {size} bytes, the "
                                                      f"shard has {len(data)} of them (truncated since indexed?)")
        return data

    def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
            future.add_done_callback(_close_when_done)
        self._pending = {}
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._prepared.close()
