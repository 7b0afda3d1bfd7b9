"""An LMDB's lock file given its disk blocks before lmdb maps it, so a full disk is named.

With ``lock=True`` lmdb creates ``lock.mdb`` (``<file>-lock`` for ``subdir=False``),
extends it with ``ftruncate`` (which allocates nothing) and writes its reader table
through a shared map. On a full disk the first write to an unallocated page of that map
is SIGBUS: the guard process dies ("damaged file"), a DataLoader worker dies (torch calls
it "insufficient shared memory"). ``posix_fallocate`` of the size lmdb will use
allocates those blocks up front (holes only: a lock file in use keeps its contents), or
fails with ENOSPC, which is then named.
"""

from __future__ import annotations

import errno
import os
import shutil
from typing import Any

MAX_READERS = 4096  # what fastload opens every environment with
# lmdb 0.9's lock file: an MDB_txninfo header (three 64-byte cache lines) and one 64-byte
# MDB_reader per reader after the first (lmdb sizes it (max_readers - 1) * 64 + 192).
_READER_BYTES = 64
_HEADER_BYTES = 192


def lock_file_path(path: str) -> str:
    """The lock file of the LMDB at ``path`` (a folder holding data.mdb, or the file itself)."""
    return os.path.join(path, "lock.mdb") if os.path.isdir(path) else path + "-lock"


def lock_file_bytes(max_readers: int = MAX_READERS) -> int:
    return (max_readers - 1) * _READER_BYTES + _HEADER_BYTES


def no_space_message(path: str, needed: int) -> str:
    file = lock_file_path(path)
    try:
        free = f"{shutil.disk_usage(os.path.dirname(file) or '.').free:,} bytes free"
    except OSError:
        free = "free space unknown"
    return (
        f"LMDB {path}: no space left on the disk of its lock file {file} ({free}; lock=True needs "
        f"{needed:,} bytes there for lmdb's reader table). Free some space, or open it with "
        "lock=False (the default: reading a file nobody writes to needs no lock file)"
    )


def reserve_lock_file(path: str, options: dict[str, Any]) -> None:
    """Allocates the lock file's blocks when ``options`` open the LMDB with a lock file.

    An unwritable folder or a read-only filesystem is left to lmdb, which names it.

    Raises:
        OSError: ENOSPC (or EDQUOT): the disk of the lock file is full (named, with the
            space needed and free).
    """
    if not options.get("lock", True):
        return
    file = lock_file_path(path)
    needed = lock_file_bytes()
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT, options.get("mode", 0o755))  # lmdb's own mode for it
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, no_space_message(path, needed)) from e
        return  # lmdb opens it itself and reports what stops it
    try:
        os.posix_fallocate(fd, 0, max(needed, os.fstat(fd).st_size))
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, no_space_message(path, needed)) from e
        # EOPNOTSUPP, EINVAL: a filesystem without fallocate; lmdb goes on as before
    finally:
        os.close(fd)
