"""TFRecord framing: uint64 length, masked crc32c of the length, data, masked crc32c of the data.

A length read from a file is trusted only after its CRC matches and it fits in what is
left of the file (or under MAX_RECORD_BYTES when that is unknown, as inside GZIP), so a
corrupt header never sizes an allocation.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from ..chunks import read_up_to

HEADER_BYTES = 12  # length + its CRC
OVERHEAD = 16  # header + data CRC
# Protobuf refuses messages over 2 GiB, so a longer record is corruption, not data.
MAX_RECORD_BYTES = (1 << 31) - 1
_CHUNK = 1 << 24

_crc32c_fn = None


class TFRecordError(ValueError):
    """A TFRecord file is broken, or does not match its index.

    Attributes:
        path: The file.
        offset: Byte offset of the record (None when unknown).
        problem: The message without the path.
    """

    def __init__(self, path: str, offset: int | None, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.offset, self.problem = path, offset, problem

    def __reduce__(self):  # crosses worker processes intact
        return type(self), (self.path, self.offset, self.problem)


def masked_crc(data: Any) -> int:
    """TFRecord's masked crc32c of ``data``."""
    global _crc32c_fn
    if _crc32c_fn is None:
        try:
            import crc32c
        except ImportError as e:
            raise ImportError("TFRecord support needs crc32c: pip install tfrecord") from e
        _crc32c_fn = crc32c.crc32c
    return mask(_crc32c_fn(data))


def mask(crc: int) -> int:
    """TFRecord's masking of a crc32c (what a frame stores)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def stored_crc(framed: Any) -> int:
    """The masked data CRC a record's frame stores: the last 4 bytes of ``framed`` (a whole
    record, or its data and CRC)."""
    return struct.unpack_from("<I", framed, len(framed) - 4)[0]


def frame(data: bytes, crc: int | None = None) -> bytes:
    """``data`` framed as one TFRecord record (``crc``: its crc32c, when already known)."""
    head = struct.pack("<Q", len(data))
    tail = masked_crc(data) if crc is None else mask(crc)
    return head + struct.pack("<I", masked_crc(head)) + data + struct.pack("<I", tail)


def check_header(head: Any, path: str, offset: int, remaining: int | None) -> int:
    """The data length in a 12-byte header, once its CRC and size check out.

    Args:
        head: The header bytes (fewer than 12 means the file ends inside it).
        path, offset: Where the record is, for the error message.
        remaining: Bytes left in the file from ``offset``; None when unknown (GZIP).

    Raises:
        TFRecordError: Truncated header, length CRC mismatch, or a length the file cannot hold.
    """
    if len(head) < HEADER_BYTES:
        raise TFRecordError(path, offset, f"truncated record header at byte {offset} ({len(head)} of 12 bytes)")
    length, length_crc = struct.unpack_from("<QI", head)
    if masked_crc(bytes(head[:8])) != length_crc:
        raise TFRecordError(path, offset, f"length CRC mismatch at byte {offset} (corrupt file or wrong index)")
    if length > MAX_RECORD_BYTES:
        raise TFRecordError(
            path,
            offset,
            f"record at byte {offset} claims {length} bytes, more than any record can hold (corrupt length)",
        )
    if remaining is not None and OVERHEAD + length > remaining:
        raise TFRecordError(
            path,
            offset,
            f"truncated record at byte {offset}: needs {OVERHEAD + length} bytes, the file has {remaining} left",
        )
    return length


def check_data(view: memoryview, length: int, path: str, offset: int, check_crc: bool) -> memoryview:
    """The data of a record whose bytes after the header are ``view`` (data + CRC)."""
    if len(view) < length + 4:
        raise TFRecordError(
            path,
            offset,
            f"truncated record at byte {offset}: needs {OVERHEAD + length} bytes, has {HEADER_BYTES + len(view)}",
        )
    data = view[:length]
    if check_crc and masked_crc(data) != struct.unpack_from("<I", view, length)[0]:
        raise TFRecordError(path, offset, f"data CRC mismatch in record at byte {offset}")
    return data


def parse_record(buf: Any, path: str, offset: int, check_data_crc: bool = True) -> memoryview:
    """The data of the one framed record that ``buf`` holds (as read through an index).

    Raises:
        TFRecordError: Broken framing, a data CRC mismatch, or a record whose length is not
            ``len(buf)`` (the index does not match the file).
    """
    view = memoryview(buf)
    length = check_header(view[:HEADER_BYTES], path, offset, None)
    if OVERHEAD + length != len(view):
        raise TFRecordError(
            path,
            offset,
            f"record at byte {offset} holds {OVERHEAD + length} bytes but the index says {len(view)} (stale index?)",
        )
    return check_data(view[HEADER_BYTES:], length, path, offset, check_data_crc)


def _read(f: BinaryIO, n: int, path: str, offset: int) -> bytes:
    # GZIP and zlib report a damaged or cut stream as these; they are framing errors too.
    try:
        return read_up_to(f, n, _CHUNK)
    except (EOFError, zlib.error, OSError) as e:
        raise TFRecordError(path, offset, f"unreadable compressed data near record at byte {offset}: {e}") from e


def iter_records(
    f: BinaryIO, path: str, size: int | None = None, check_data_crc: bool = True, skip: int = 0
) -> Iterator[tuple[int, memoryview | None]]:
    """(offset, data) for each record of an open file, read sequentially.

    Args:
        f: The file, positioned at a record (GZIP files decompressed).
        path: Its name, for errors.
        size: The file's size when known (plain files), bounding every length.
        check_data_crc: Verify each record's data CRC.
        skip: Yield the first ``skip`` records as (offset, None) without reading or
            checking their data (their lengths are still checked).

    Raises:
        TFRecordError: On the first broken record (naming its offset).
    """
    offset = f.tell() if size is not None else 0
    k = 0
    while True:
        head = _read(f, HEADER_BYTES, path, offset)
        if not head:
            return
        length = check_header(head, path, offset, None if size is None else size - offset)
        if k < skip:
            if size is not None:
                f.seek(length + 4, io.SEEK_CUR)
            else:
                _skip(f, length + 4, path, offset)
            yield offset, None
        else:
            yield (
                offset,
                check_data(memoryview(_read(f, length + 4, path, offset)), length, path, offset, check_data_crc),
            )
        offset += OVERHEAD + length
        k += 1


def _skip(f: BinaryIO, n: int, path: str, offset: int) -> None:
    start = f.tell()
    try:
        got = f.seek(n, io.SEEK_CUR) - start
    except (EOFError, zlib.error, OSError) as e:
        raise TFRecordError(path, offset, f"unreadable compressed data near record at byte {offset}: {e}") from e
    if got != n:
        raise TFRecordError(
            path, offset, f"truncated record at byte {offset}: needs {n + HEADER_BYTES} bytes, has {got + HEADER_BYTES}"
        )
