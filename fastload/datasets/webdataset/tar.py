"""Tar headers read by hand: members of a shard (name, data offset, size), checked before they are trusted.

A header's checksum is verified, its size field parsed strictly (octal or base-256), and a
member whose data would run past the end of the shard is a truncation, all before any
size from the file is used. The only allocations a header sizes are GNU long names and
PAX records, bounded by MAX_NAME_BYTES and MAX_PAX_BYTES. Member data is never read
here: a local shard is indexed by seeking from header to header, a download by
discarding the data as it streams past.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

BLOCK = 512
MAX_NAME_BYTES = 64 << 10
MAX_PAX_BYTES = 1 << 20
REGULAR = (b"0", b"\0", b"7")  # file, old-style file, contiguous file
ZERO_BLOCK = bytes(BLOCK)


class ShardError(ValueError):
    """A shard is missing, broken or cut short.

    Attributes:
        url: The shard.
        offset: Byte offset where the problem was found (None when not known).
        problem: The message without the URL.
    """

    def __init__(self, url: str, offset: int | None = None, problem: str = "") -> None:
        if not problem and offset is None:  # DataLoader re-raises worker errors as type(e)(message)
            super().__init__(url)
            self.url, self.offset, self.problem = "", None, url
            self.member: str | None = None
            return
        super().__init__(f"{url}: {problem}" + (f" (at byte {offset})" if offset is not None else ""))
        self.url, self.offset, self.problem = url, offset, problem
        self.member = None  # the member the archive breaks in, when known

    def __reduce__(self):
        return type(self), (self.url, self.offset, self.problem)


@dataclass(frozen=True)
class Member:
    """A regular file in a tar archive: its full name, where its data starts, and its size."""

    name: str
    offset: int
    size: int


def _number(field: bytes, what: str, url: str, offset: int) -> int:
    """A numeric header field: NUL/space-terminated octal, or GNU base-256 (high bit set)."""
    if field[:1] and field[0] & 0x80:
        if field[0] & 0x40:
            raise ShardError(url, offset, f"negative {what} in a tar header")
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = (value << 8) | byte
        return value
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise ShardError(
            url, offset, f"the {what} field {field!r} of a tar header is not octal (not a tar file, or corrupt)"
        ) from None


def check_header(block: bytes, url: str, offset: int) -> None:
    """Raises ShardError unless ``block``'s checksum (unsigned or signed bytes) matches."""
    stored = _number(block[148:156], "checksum", url, offset)
    head = block[:148] + b"        " + block[156:]
    unsigned = sum(head)
    if stored == unsigned:
        return
    if stored != unsigned - 256 * sum(1 for b in head if b > 127):  # old tars summed signed bytes
        raise ShardError(url, offset, "tar header checksum mismatch (not a tar file, or corrupt)")


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    """PAX records ``"<len> key=value\\n"``; only the fields that matter here are kept."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos : pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ShardError(url, offset, "a malformed PAX header record") from None
        if space < 0 or length <= space - pos or pos + length > len(data):
            raise ShardError(url, offset, "a malformed PAX header record")
        key, sep, value = data[space + 1 : pos + length - 1].partition(b"=")
        if not sep:
            raise ShardError(url, offset, "a malformed PAX header record")
        if key in (b"path", b"size"):
            fields[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return fields


class Source:
    """Sequential bytes of a shard: ``read(n)`` (short only at the end) and ``skip(n)``."""

    def __init__(self, read: Callable[[int], bytes], skip: Callable[[int], None] | None = None) -> None:
        self.read = read
        self.skip = skip if skip is not None else self._skip_by_reading

    def _skip_by_reading(self, n: int) -> None:
        while n > 0:
            got = self.read(min(n, 1 << 20))
            if not got:
                return
            n -= len(got)


def file_source(f) -> Source:
    """A Source over a seekable local file: data is skipped by seeking."""
    return Source(f.read, lambda n: f.seek(n, os.SEEK_CUR))


def iter_members(source: Source, url: str, size: int | None) -> Iterator[Member]:
    """The regular files of a tar archive, in order, up to its end-of-archive block.

    Args:
        source: The archive's bytes from its start.
        url: Named in errors.
        size: The archive's size when known: a member that would run past it is an error
            before anything is skipped.

    Raises:
        ShardError: A bad checksum or field, an oversized long name or PAX header, or the
            archive ending (or ``size`` reached) before a member's data or the end block.
    """
    offset = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        block = source.read(BLOCK)
        if len(block) < BLOCK:
            raise ShardError(
                url,
                offset,
                f"the archive ends at byte {offset + len(block)} without its end-of-archive block (truncated?)",
            )
        if block == ZERO_BLOCK:
            return
        check_header(block, url, offset)
        length = _number(block[124:136], "size", url, offset)
        kind = block[156:157]
        data_at = offset + BLOCK
        if "size" in pax and kind in REGULAR:
            try:
                length = int(pax.pop("size"))
            except ValueError:
                raise ShardError(url, offset, "a PAX size that is not a number") from None
        padded = -(-length // BLOCK) * BLOCK
        if size is not None and data_at + length > size:
            error = ShardError(
                url,
                offset,
                f"member {_text(block[:100])!r} needs {length} bytes from byte "
                f"{data_at}, but the shard has {size} (truncated?)",
            )
            if kind in REGULAR:
                error.member = long_name or pax.get("path") or _text(block[:100])  # which sample it cuts off
            raise error
        if kind in (b"L", b"x"):
            limit = MAX_NAME_BYTES if kind == b"L" else MAX_PAX_BYTES
            if length > limit:
                raise ShardError(
                    url,
                    offset,
                    f"a {'long name' if kind == b'L' else 'PAX header'} of {length} bytes (the limit is {limit})",
                )
            data = source.read(padded)
            if len(data) < padded:
                raise ShardError(
                    url, offset, f"the archive ends inside a header at byte {data_at + len(data)} (truncated?)"
                )
            if kind == b"L":
                long_name = _text(data[:length])
            else:
                pax = _pax(data[:length], url, offset)
        elif kind in REGULAR:
            name = long_name or pax.get("path")
            if name is None:
                name = _text(block[:100])
                if block[257:262] == b"ustar" and block[345]:
                    name = _text(block[345:500]) + "/" + name
            yield Member(name, data_at, length)
            long_name, pax = None, {}
            source.skip(padded)
        else:  # directories, links, global PAX headers: no sample data
            long_name, pax = None, {}
            source.skip(padded)
        offset = data_at + padded
