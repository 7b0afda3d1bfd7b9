"""The tuner's output files (``--json``, ``--plot``): checked before measuring, written whole or not at all.

A run measures for minutes before it writes anything, so a file that cannot be written must
be found out first: the check makes (and removes) a probe file of :data:`PROBE_BYTES` in the
file's folder, which a full disk, a read-only file system or a folder no file can be made in
(``/proc``) refuses. The disk can still fill while the tuner measures: the report is then
written to a temporary file beside its name and renamed over it only once complete, so a
failed write leaves no empty or cut-off file, and :func:`keep_elsewhere` saves it in the
temporary folder so the measurements are not lost.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

#: Bytes the check writes: more than the report of a large grid takes (about 1 KB a configuration).
PROBE_BYTES = 1 << 20


def reason(error: OSError) -> str:
    """``error`` in words, without Python's ``[Errno N]`` prefix."""
    return error.strerror or str(error)


def _special(path: str) -> bool:
    """``path`` exists and is not a regular file (``/dev/stdout``, a pipe): written in place."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def check_output(path: str | None, flag: str) -> None:
    """Fails now, not after the measurements, when ``path`` cannot be written.

    Raises:
        ValueError: ``path`` is a folder, or its folder refuses a file of :data:`PROBE_BYTES`
            (full, read-only, or not a folder files can be made in); the message names it.
        FileNotFoundError: The folder does not exist.
    """
    if path is None:
        return
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a folder; give a file name")
    target = os.path.realpath(path)
    if _special(target):
        return
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{flag} {path}: folder {folder} does not exist (create it first)")
    probe = os.path.join(folder, f".fastload-tune-{uuid.uuid4().hex}.probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise ValueError(f"{flag} {path}: no file can be made in {folder} ({reason(e)})") from None
    try:
        block = bytes(64 * 1024)
        for _ in range(PROBE_BYTES // len(block)):
            os.write(fd, block)
        os.fsync(fd)
    except OSError as e:
        raise ValueError(
            f"{flag} {path}: {folder} cannot take a {PROBE_BYTES >> 20} MB file ({reason(e)}); "
            "free some space or write elsewhere"
        ) from None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def write_whole(path: str, write: Callable[[IO[Any]], None], binary: bool = False) -> None:
    """Writes ``path`` through ``write(file)``, all or nothing.

    The content goes to a new file beside ``path`` (named after it, hidden), is flushed to
    disk, then renamed over ``path``: a write that fails (a full disk) or is interrupted
    removes the new file and leaves ``path`` as it was. A ``path`` that is no regular file
    (``/dev/stdout``) is written in place.

    Raises:
        OSError: The write failed; nothing was left behind.
    """
    mode = "wb" if binary else "w"
    target = os.path.realpath(path)  # a symbolic link keeps pointing at the new file
    if _special(target):
        with open(target, mode) as f:
            write(f)
        return
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to open()
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def keep_elsewhere(write: Callable[[IO[Any]], None], suffix: str, binary: bool = False) -> str | None:
    """Writes through ``write`` to a new file in the temporary folder; its path, or None if that fails too."""
    path = os.path.join(tempfile.gettempdir(), f"fastload-tune-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}{suffix}")
    try:
        write_whole(path, write, binary)
    except OSError:
        return None
    return path


def write_output(path: str, flag: str, write: Callable[[IO[Any]], None], suffix: str, binary: bool = False) -> bool:
    """Writes ``path`` whole (:func:`.files.write_whole`); where that fails, says why on stderr and
    keeps the output in the temporary folder instead. Whether ``path`` was written."""
    try:
        write_whole(path, write, binary)
    except OSError as e:
        kept = keep_elsewhere(write, suffix, binary)
        where = f"kept in {kept} instead" if kept else "not kept anywhere (the temporary folder refused it too)"
        print(f"fastload tune: error: cannot write {flag} {path} ({reason(e)}); {where}", file=sys.stderr)
        return False
    print(f"wrote {path}")
    return True
