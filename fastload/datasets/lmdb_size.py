"""An LMDB's data file checked against the size its own header pages claim.

LMDB maps the data file and reads pages straight from the map, so a file cut short (an
interrupted copy, a full disk) kills the process with SIGBUS at the first page past the
end. Both meta pages sit at the start of the file; the current one (the higher
transaction id) names the last page in use, so the size the file must have is known
before lmdb ever maps it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

MAGIC = 0xBEEFC0DE
# LMDB 0.9 meta page on a 64-bit build: a 16-byte page header, then magic (u32), version
# (u32), address (ptr), mapsize (size_t), two 48-byte MDB_db records whose first u32 in
# the free-list one holds the page size, the last page number and the transaction id.
_HEADER = 16
_MAGIC = struct.Struct("=II")
_PSIZE_AT = _HEADER + 24
_LAST_AT = _HEADER + 120
_LAST_TXN = struct.Struct("=QQ")
_META_BYTES = _LAST_AT + _LAST_TXN.size


@dataclass(frozen=True)
class DataFile:
    """The data file of an LMDB and the bytes its current meta page says it needs."""

    path: str
    required: int
    page_size: int


def data_file_path(path: str) -> str:
    """The data file of the LMDB at ``path`` (a folder holding data.mdb, or the file itself)."""
    return os.path.join(path, "data.mdb") if os.path.isdir(path) else path


def _meta(blob: bytes, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txn id) of the meta page at ``offset``; None when not one."""
    if len(blob) < offset + _META_BYTES:
        return None
    magic, _version = _MAGIC.unpack_from(blob, offset + _HEADER)
    if magic != MAGIC:
        return None
    (psize,) = struct.unpack_from("=I", blob, offset + _PSIZE_AT)
    last, txn = _LAST_TXN.unpack_from(blob, offset + _LAST_AT)
    return psize, last, txn


def truncated_message(file: str, size: int, required: int, page_size: int) -> str:
    return (
        f"LMDB data file {file} is truncated: it has {size:,} bytes but its header says it holds "
        f"{required // page_size:,} pages of {page_size} bytes ({required:,} bytes). An interrupted "
        "copy or a full disk leaves this; copy or convert it again"
    )


def check_data_file(path: str) -> DataFile | None:
    """Checks the data file of the LMDB at ``path`` before lmdb maps it.

    Returns:
        What the file must hold, or None when its first page is no LMDB meta page (lmdb
        then reports the file itself).

    Raises:
        FileNotFoundError: There is no data file.
        ValueError: The file is empty, or shorter than its current meta page says (named, with sizes).
    """
    file = data_file_path(path)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path} is not an LMDB: {file} does not exist")
    size = os.path.getsize(file)
    if size == 0:  # lmdb would try to write its first pages, read-only: "Bad file descriptor"
        raise ValueError(
            f"LMDB data file {file} is empty (0 bytes): an interrupted copy or a full disk "
            "leaves this; copy or convert it again"
        )
    with open(file, "rb") as f:
        first = f.read(_META_BYTES)
        head = _meta(first, 0)
        if head is None:
            return None
        psize = head[0]
        if not 512 <= psize <= 1 << 20:  # a header from a stranger sizes no read
            raise ValueError(
                f"LMDB data file {file}: page size {psize} in its header is not a plausible LMDB "
                "page size; the file is damaged"
            )
        f.seek(psize)
        second = _meta(f.read(_META_BYTES), 0)
    if second is None:
        raise ValueError(
            f"LMDB data file {file} is truncated or damaged: it has {size:,} bytes and no second "
            f"meta page at byte {psize} (an LMDB begins with two {psize}-byte meta pages); copy or "
            "convert it again"
        )
    _, last, _ = max(head, second, key=lambda m: m[2])
    required = (last + 1) * psize
    if size < required:
        raise ValueError(truncated_message(file, size, required, psize))
    return DataFile(file, required, psize)


def check_still_whole(data: DataFile | None) -> None:
    """Raises ValueError when ``data``'s file has shrunk below what it held when opened.

    One stat per read: cheap beside a decode, and a page past the end would be SIGBUS.
    """
    if data is None:
        return
    size = os.stat(data.path).st_size
    if size < data.required:
        raise ValueError(truncated_message(data.path, size, data.required, data.page_size))
