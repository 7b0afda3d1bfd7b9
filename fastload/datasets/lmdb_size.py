"""An LMDB's data file checked against the size its own header pages claim, and against the
file it was when the dataset opened it.

LMDB maps the data file and reads pages straight from the map, so a file cut short (an
interrupted copy, a full disk) kills the process with SIGBUS at the first page past the
end. Both meta pages sit at the start of the file; the current one (the higher
transaction id) names the last page in use, so the size the file must have is known
before lmdb ever maps it.

A file replaced while a dataset is open (an atomic rename of a new conversion, a copy
over it) holds other samples under the keys the dataset indexed: every process that
opens it again (a restarted guard, a new worker) would read other images under the old
labels. So the dataset keeps the file's identity from when it opened it (device and
inode, size, modification time, and a hash of the two meta pages, which name the
current transaction and the B-tree's root), checks the cheap part (one ``stat``) before
every read and all of it whenever a process opens the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

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


class LMDBChangedError(ValueError):
    """An LMDB's data file was replaced or written to since the dataset opened it.

    Attributes:
        path: The data file.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class DataFile:
    """The data file of an LMDB, the bytes its current meta page says it needs, and what
    it was when opened (see the module's docstring).

    Attributes:
        writers: Writers may commit while it is read (opened with ``lock=True``, whose
            locking makes that safe, or not read-only): only a replacement or a shrink is
            then an error.
    """

    path: str
    required: int
    page_size: int
    device: int = 0
    inode: int = 0
    size: int = 0
    mtime_ns: int = 0
    fingerprint: str = ""
    writers: bool = False

    def same_file(self, other: DataFile | None) -> bool:
        """Whether ``other`` describes this file as it is here (whatever ``writers`` says)."""
        return other is not None and dataclasses.replace(other, writers=self.writers) == self


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


def check_data_file(path: str, writers: bool = False) -> DataFile | None:
    """Checks the data file of the LMDB at ``path`` before lmdb maps it.

    Args:
        path: The LMDB (folder or file).
        writers: Writers may commit while it is read (see :attr:`DataFile.writers`).

    Returns:
        What the file must hold and what it is now, or None when its first page is no
        LMDB meta page (lmdb then reports the file itself).

    Raises:
        FileNotFoundError: There is no data file.
        ValueError: The file is empty, or shorter than its current meta page says (named, with sizes).
    """
    file = data_file_path(path)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path} is not an LMDB: {file} does not exist")
    with open(file, "rb") as f:
        st = os.fstat(f.fileno())  # of the file read below, whatever is renamed over the path meanwhile
        return _checked(file, f, st, writers)


def _checked(file: str, f: BinaryIO, st: os.stat_result, writers: bool) -> DataFile | None:
    size = st.st_size
    if size == 0:  # lmdb would try to write its first pages, read-only: "Bad file descriptor"
        raise ValueError(
            f"LMDB data file {file} is empty (0 bytes): an interrupted copy or a full disk "
            "leaves this; copy or convert it again"
        )
    first = f.read(_META_BYTES)
    head = _meta(first, 0)
    if head is None:
        return None
    psize = head[0]
    if not 512 <= psize <= 1 << 20:  # a header from a stranger sizes no read
        raise ValueError(
            f"LMDB data file {file}: page size {psize} in its header is not a plausible LMDB page size; "
            "the file is damaged"
        )
    f.seek(psize)
    second_page = f.read(_META_BYTES)
    second = _meta(second_page, 0)
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
    fingerprint = hashlib.sha256(first + second_page).hexdigest()[:32]
    return DataFile(file, required, psize, st.st_dev, st.st_ino, size, st.st_mtime_ns, fingerprint, writers)


def _changed(data: DataFile, how: str) -> LMDBChangedError:
    return LMDBChangedError(
        f"LMDB data file {data.path} {how} since the dataset opened it: its keys would now give other "
        "samples than the ones it indexed. Make the dataset again to read the new file (or replace "
        "an LMDB only between runs)",
        data.path,
    )


def check_still_whole(data: DataFile | None) -> None:
    """Raises when ``data``'s file was replaced, written to, or shrank since it was opened.

    One stat per read: cheap beside a decode, and a page past the end would be SIGBUS.

    Raises:
        LMDBChangedError: Another file is at the path now (another inode), or the file's
            size or modification time changed (only a replacement when ``data.writers``).
        ValueError: The file is shorter than its header said (truncated).
    """
    if data is None:
        return
    st = os.stat(data.path)
    if (st.st_dev, st.st_ino) != (data.device, data.inode):
        raise _changed(data, f"was replaced by another file (inode {data.inode}, now {st.st_ino})")
    if st.st_size < data.required:
        raise ValueError(truncated_message(data.path, st.st_size, data.required, data.page_size))
    if not data.writers and (st.st_size, st.st_mtime_ns) != (data.size, data.mtime_ns):
        raise _changed(
            data,
            f"was written to (size {data.size:,} -> {st.st_size:,} bytes, "
            f"mtime {data.mtime_ns} -> {st.st_mtime_ns} ns)",
        )


def check_same_file(data: DataFile | None) -> None:
    """:func:`check_still_whole`, and the meta pages' hash: for a process that has just opened
    the file (a guard, a worker), so it never reads another file under the dataset's keys.

    Raises:
        LMDBChangedError, ValueError: As :func:`check_still_whole`; also when the meta pages
            differ (a copy over the file that kept its size and time), unless ``data.writers``.
    """
    if data is None:
        return
    check_still_whole(data)
    if data.writers:
        return
    with open(data.path, "rb") as f:
        now = _checked(data.path, f, os.fstat(f.fileno()), data.writers)
    if now is None or now.fingerprint != data.fingerprint:
        raise _changed(data, "was rewritten (its header pages differ)")
