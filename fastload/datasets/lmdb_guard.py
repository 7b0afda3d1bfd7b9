"""Reads of an LMDB in a guard process, so a damaged file cannot kill the training process.

LMDB reads pages straight from a memory map. A data file cut short while in use (an
``rsync`` or copy replacing it, a full disk) raises SIGBUS at the first page past its
new end, and a B-tree page with flipped bits sends lmdb's C code to a wild address
(SIGSEGV). Neither can be caught in Python, and no check before a read closes the
window: the file can shrink between the check and the access, and a damaged page is
only known by following it. Worker processes of the process backend may read directly
(a crash there is a named WorkerFailure); every other process (the thread backend, no
workers, a dataset's own constructor) reads through one guard process per LMDB, which
dies instead, and the read raises :class:`LMDBReadError`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from .lmdb_size import DataFile, check_data_file, check_still_whole

_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lmdb_guard_server.py")
_LEN = struct.Struct("<Q")
_KEY = struct.Struct("<I")


class LMDBReadError(ValueError):
    """An LMDB read killed the guard process (a damaged or shrinking file), or lmdb failed.

    Attributes:
        path: The LMDB.
        key: The key being read (None for a scan).
    """

    def __init__(self, message: str, path: str, key: bytes | None) -> None:
        super().__init__(message)
        self.path, self.key = path, key


class Guard:
    """One guard process reading the LMDB at ``path``; threads share it (one request at a time)."""

    def __init__(self, path: str, options: dict[str, Any], data: DataFile | None) -> None:
        self.path, self.options, self.data = path, options, data
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.pid = os.getpid()

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None or self.pid != os.getpid():
            if self.proc is not None and self.pid == os.getpid():
                self._drop(self.proc)  # ended between reads (killed from outside): start another
            self.pid = os.getpid()
            self.proc = subprocess.Popen(
                [sys.executable, "-I", _SERVER, self.path, json.dumps(self.options)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
            )
        return self.proc

    def _read(self, proc: subprocess.Popen, n: int) -> bytes:
        assert proc.stdout is not None
        chunks, left = [], n
        while left:
            chunk = proc.stdout.read(left)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _answer(self, proc: subprocess.Popen) -> tuple[bytes, bytes]:
        status = self._read(proc, 1)
        (size,) = _LEN.unpack(self._read(proc, _LEN.size))
        return status, self._read(proc, size)

    def _died(self, proc: subprocess.Popen, key: bytes | None) -> LMDBReadError:
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        self._drop(proc)  # the next read starts a new one
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        what = f"reading key {key!r}" if key is not None else "scanning its keys"
        cause = "its data file is damaged (a B-tree page that does not hold together)"
        try:
            check_still_whole(self.data)
        except ValueError as e:
            cause = f"its data file shrank while in use: {e}"
        return LMDBReadError(
            f"LMDB {self.path}: the guard process reading it died by {how} {what}; {cause}. "
            "The training process is unaffected; copy or convert the LMDB again",
            self.path,
            key,
        )

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` (None when absent).

        Raises:
            LMDBReadError: The read killed the guard process, or lmdb reported an error.
            ValueError: The data file is shorter than when it was opened (checked first).
        """
        check_still_whole(self.data)
        with self.lock:
            proc = self._start()
            assert proc.stdin is not None
            try:
                proc.stdin.write(b"G" + _KEY.pack(len(key)) + key)
                status, payload = self._answer(proc)
            except (EOFError, BrokenPipeError):
                raise self._died(proc, key) from None
        if status == b"N":
            return None
        if status == b"E":
            raise LMDBReadError(
                f"LMDB {self.path}: reading key {key!r}: {payload.decode(errors='replace')}", self.path, key
            )
        return payload

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value), in key order (the guard's lock is held until the scan ends;
        a scan left unfinished ends the guard process, whose answers would be out of step)."""
        check_still_whole(self.data)
        with self.lock:
            proc = self._start()
            assert proc.stdin is not None
            finished = False
            try:
                proc.stdin.write(b"S")
                while True:
                    status, payload = self._answer(proc)
                    if status == b".":
                        finished = True
                        return
                    if status == b"E":
                        finished = True
                        raise LMDBReadError(
                            f"LMDB {self.path}: scanning: {payload.decode(errors='replace')}", self.path, None
                        )
                    _, value = self._answer(proc)
                    yield payload, value
            except (EOFError, BrokenPipeError):
                finished = True
                raise self._died(proc, None) from None
            finally:
                if not finished:
                    proc.kill()
                    proc.wait()
                    self._drop(proc)

    def _drop(self, proc: subprocess.Popen) -> None:
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        if self.proc is proc:
            self.proc = None

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and self.pid == os.getpid():
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            try:
                proc.wait(timeout=5)  # EOF on its stdin ends it
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


_guards: dict[tuple[str, int], Guard] = {}
_guards_lock = threading.Lock()


def guard_for(path: str, options: dict[str, Any]) -> Guard:
    """This process's guard of the LMDB at ``path`` (one per path, shared by its datasets).

    Raises:
        ValueError: The data file is empty or shorter than its header says (checked when
            the guard is made, before any process maps it).
    """
    key = (os.path.realpath(path), os.getpid())
    with _guards_lock:
        guard = _guards.get(key)
        if guard is None:
            guard = _guards[key] = Guard(path, options, check_data_file(path))
        return guard


@atexit.register
def _close_all() -> None:
    """Ends this process's guards at exit (each would end on EOF anyway; this waits for them)."""
    with _guards_lock:
        mine = [g for (_, pid), g in _guards.items() if pid == os.getpid()]
        _guards.clear()
    for guard in mine:
        guard.close()
