"""gzip-compressed shards (``.tar.gz``, ``.tgz``): decompressed as they stream.

A compressed tar has no byte offsets to read a member at, so such a shard is read whole
through the decompressor: indexed while it streams, into the shard cache as a plain tar
(samples are then read from that copy at their offsets), or, without a cache, streamed
again up to each span a chunk of samples needs.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from .tar import ShardError

CHUNK = 1 << 20


def file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return
            yield chunk


def gunzip(chunks: Iterator[bytes], url: str) -> Iterator[bytes]:
    """The decompressed bytes of a gzip stream (several members concatenated, as pigz writes, too).

    Raises:
        ShardError: Not gzip data, or the stream ends inside a member (truncated).
    """
    d, started, done = zlib.decompressobj(wbits=31), False, 0
    for chunk in chunks:
        while chunk:
            if not started and not chunk.strip(b"\0"):  # zero padding after the last member
                break
            started = True
            try:
                out = d.decompress(chunk)
            except zlib.error as e:
                raise ShardError(
                    url, None, f"not gzip data, or corrupt: {e} (after {done} decompressed bytes)"
                ) from None
            if out:
                done += len(out)
                yield out
            chunk = b""
            if d.eof:
                chunk, d, started = d.unused_data, zlib.decompressobj(wbits=31), False
    if started:
        raise ShardError(
            url, None, f"the gzip stream ends early, after {done} decompressed bytes (a truncated .tar.gz)"
        )


def span(chunks: Iterator[bytes], start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end - 1`` of the decompressed stream ``chunks`` (read from the start)."""
    parts, at = [], 0
    for chunk in chunks:
        lo, hi = max(start - at, 0), min(end - at, len(chunk))
        if lo < hi:
            parts.append(chunk[lo:hi])
        at += len(chunk)
        if at >= end:
            break
    return b"".join(parts)
