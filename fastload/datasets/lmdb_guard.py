"""Reads of an LMDB in a guard process, so a damaged file cannot kill the training process.

LMDB reads pages straight from a memory map. A data file cut short while in use (an
``rsync`` or copy replacing it, a full disk) raises SIGBUS at the first page past its
new end, and a B-tree page with flipped bits sends lmdb's C code to a wild address
(SIGSEGV). Neither can be caught in Python, and no check before a read closes the
window: the file can shrink between the check and the access, and a damaged page is
only known by following it. Worker processes of the process backend may read directly
(a crash there is a named WorkerFailure); every other process (the thread backend, no
workers, a dataset's own constructor) reads through one guard process per LMDB
(:mod:`.lmdb_guard_registry`), which dies instead, and the read raises :class:`LMDBReadError`.

Every wait on the guard is bounded: an answer that does not come within the read's
``timeout`` (its dataset's ``guard_timeout``: datasets sharing a guard keep their own) ends
the guard (stopped by SIGSTOP, stuck on a dead network filesystem), and so do the bounds of
the pass the read runs for (see :mod:`.waits`). A guard that dies by a signal the read did
not cause (SIGKILL from the OOM killer, SIGTERM) or hangs is replaced and the read tried
once more, with a warning that says what happened.

A guard of a file replaced since (a dataset made again opened another file at the path) is
ended for good, also while a thread reads through it: that read, and any later one, names
the change (:class:`~.lmdb_size.LMDBChangedError`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from ..system import process_state
from . import waits
from .lmdb_guard_lost import Lost, cause_of, how_lost
from .lmdb_lock import reserve_lock_file
from .lmdb_size import DataFile, check_same_file, check_still_whole

_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lmdb_guard_server.py")
_LEN = struct.Struct("<Q")
_KEY = struct.Struct("<I")
DEFAULT_TIMEOUT_S = 60.0


class LMDBReadError(ValueError):
    """An LMDB read killed the guard process (a damaged or shrinking file), the guard was
    killed from outside or did not answer (twice), or lmdb failed.

    Attributes:
        path: The LMDB.
        key: The key being read (None for a scan or the guard's start).
    """

    def __init__(self, message: str, path: str, key: bytes | None) -> None:
        super().__init__(message)
        self.path, self.key = path, key


class _Hung(Exception):
    """The guard did not answer within its timeout."""


class Guard:
    """One guard process reading the LMDB at ``path``; threads share it (one request at a time).

    Each request says how long its answer may take before the guard is taken for hung
    (``timeout``): datasets sharing the guard keep their own ``guard_timeout``.

    Args:
        path: The LMDB.
        options: ``lmdb.open``'s options.
        data: The data file as the dataset opened it (each new guard checks it opened that one).
    """

    def __init__(self, path: str, options: dict[str, Any], data: DataFile | None) -> None:
        self.path, self.options, self.data = path, options, data
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.pid = os.getpid()
        self.ended = False  # for good (see end()): no process is started for it again

    def _start(self) -> tuple[subprocess.Popen, bool]:
        """(the guard, whether it is new): the running one, else one started now (a forked
        child never touches its parent's)."""
        if self.proc is not None and self.pid == os.getpid():
            if self.proc.poll() is None:
                return self.proc, False
            self._end(self.proc)  # ended between reads (killed from outside): start another
        self.proc, self.pid = None, os.getpid()
        reserve_lock_file(self.path, self.options)  # a full disk is named here, not SIGBUS there
        self.proc = subprocess.Popen(
            [sys.executable, "-I", _SERVER, self.path, json.dumps(self.options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)  # read in bounded waits (_read)
        return self.proc, True

    def _opened(self, proc: subprocess.Popen, timeout: float) -> None:
        """Waits for a new guard to open the LMDB, and checks the file it opened is the dataset's
        (not one renamed over it since).

        Raises:
            LMDBReadError: lmdb could not open it.
            LMDBChangedError: The file was replaced or written to since the dataset opened it.
        """
        status, payload = self._answer(proc, "opening it", timeout)
        if status == b"E":
            raise LMDBReadError(f"LMDB {self.path}: {payload.decode(errors='replace')}", self.path, None)
        check_same_file(self.data)

    def _wait_readable(self, fd: int, deadline: float, what: str) -> None:
        # poll, not select: select() refuses a descriptor above 1024, which a process holding
        # many files open gives the guard's pipe.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            left = waits.check(f"the LMDB guard of {self.path} {what}")  # Interrupted: the pass was closed or is late
            now = time.monotonic()
            if now >= deadline:
                raise _Hung
            tick = min(waits.TICK_S, deadline - now, left if left is not None else waits.TICK_S)
            if poller.poll(tick * 1000):  # readable, or the guard's end of the pipe closed (EOF next)
                return

    def _read(self, proc: subprocess.Popen, n: int, deadline: float, what: str) -> bytes:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        chunks, left = [], n
        while left:
            try:
                chunk = os.read(fd, left)  # non-blocking: what is there already costs no select
            except BlockingIOError:
                self._wait_readable(fd, deadline, what)
                continue
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _answer(self, proc: subprocess.Popen, what: str, timeout: float) -> tuple[bytes, bytes]:
        deadline = time.monotonic() + timeout
        head = self._read(proc, 1 + _LEN.size, deadline, what)
        (size,) = _LEN.unpack_from(head, 1)
        return head[:1], self._read(proc, size, deadline, what)

    def _ask(self, request: bytes, key: bytes | None, what: str, timeout: float) -> tuple[bytes, bytes]:
        """Sends ``request`` and returns the answer, on a new guard once more when the guard was
        killed from outside or hung (with a warning saying so)."""
        for attempt in (1, 2):
            proc: subprocess.Popen | None = None
            try:
                if self.ended:
                    raise self._why_ended(key, what)
                proc, new = self._start()
                if self.ended:  # ended while its process started (end() saw none to kill)
                    raise self._why_ended(key, what)
                if new:
                    self._opened(proc, timeout)
                assert proc.stdin is not None
                proc.stdin.write(request)
                return self._answer(proc, what, timeout)
            except (EOFError, BrokenPipeError, _Hung) as e:
                assert proc is not None  # raised by its pipes
                lost = self._lost(proc, isinstance(e, _Hung), what, timeout, key)
            except BaseException:  # Interrupted, or an error of ours: its answers would be out of step
                if proc is not None:
                    self._end(proc)
                raise
            if attempt == 2 or not lost.again:
                again = " (a second guard process too)" if attempt == 2 else ""
                raise LMDBReadError(f"LMDB {self.path}: {lost}{again}", self.path, key)
            warnings.warn(
                f"fastload: LMDB {self.path}: {lost}; a new guard process reads it again",
                RuntimeWarning,
                stacklevel=4,
            )
        raise AssertionError("unreachable")

    def _lost(self, proc: subprocess.Popen, hung: bool, what: str, timeout: float, key: bytes | None) -> Lost:
        """Ends ``proc`` and says what happened to it.

        Raises:
            LMDBChangedError, LMDBReadError: The guard was ended for good meanwhile (:meth:`_why_ended`).
        """
        state = process_state(proc.pid) if hung else ""
        self._end(proc)
        if self.ended:  # killed by end(): not the file's fault, nor a reason to start another
            raise self._why_ended(key, what)
        code = proc.returncode
        cause = cause_of(signal.Signals(-code), self.path, self.options, self.data) if code and code < 0 else ""
        return how_lost(proc.pid, code, state, hung, what, timeout, cause)

    def _why_ended(self, key: bytes | None, what: str) -> ValueError:
        """The error of a request to a guard ended for good: the change of its data file, the
        reason :func:`guard_for` ends one (raised here), else that it was closed."""
        check_same_file(self.data)
        return LMDBReadError(f"LMDB {self.path}: its guard was closed while {what}", self.path, key)

    def _locked(self, what: str) -> None:
        """Takes the lock, waiting within the pass's bounds (a read that hangs holds it until
        its own timeout ends the guard)."""
        while not self.lock.acquire(timeout=waits.TICK_S):
            waits.check(f"the LMDB guard of {self.path} (held by another thread's read) before {what}")

    def get(self, key: bytes, timeout: float) -> bytes | None:
        """The value of ``key`` (None when absent), its answer awaited up to ``timeout`` seconds.

        Raises:
            LMDBReadError: The read killed the guard process, the guard was killed from
                outside or hung twice, or lmdb reported an error.
            LMDBChangedError: The data file was replaced or written to since it was opened
                (also when a guard of the new file ended this one during the read).
            ValueError: The data file is shorter than when it was opened (checked first).
            waits.Interrupted: The pass this read runs for was closed or ran past its timeout.
        """
        check_still_whole(self.data)
        what = f"reading key {key!r}"
        self._locked(what)
        try:
            status, payload = self._ask(b"G" + _KEY.pack(len(key)) + key, key, what, timeout)
        finally:
            self.lock.release()
        if status == b"N":
            return None
        if status == b"E":
            raise LMDBReadError(
                f"LMDB {self.path}: reading key {key!r}: {payload.decode(errors='replace')}", self.path, key
            )
        return payload

    def items(self, timeout: float) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value), in key order, each answer awaited up to ``timeout`` seconds (the
        guard's lock is held until the scan ends; a scan left unfinished ends the guard
        process, whose answers would be out of step)."""
        check_still_whole(self.data)
        what = "scanning its keys"
        self._locked(what)
        proc = None
        try:
            status, payload = self._ask(b"S", None, what, timeout)  # the first answer, retried like a read
            proc = self.proc
            while True:
                if status == b".":
                    return
                if status == b"E":
                    text = payload.decode(errors="replace")
                    raise LMDBReadError(f"LMDB {self.path}: scanning: {text}", self.path, None)
                assert proc is not None
                _, value = self._answer(proc, what, timeout)
                yield payload, value
                status, payload = self._answer(proc, what, timeout)
        except (EOFError, BrokenPipeError, _Hung) as e:
            assert proc is not None
            lost = self._lost(proc, isinstance(e, _Hung), what, timeout, None)
            proc = None
            raise LMDBReadError(f"LMDB {self.path}: {lost}", self.path, None) from None
        finally:
            if proc is not None and status != b".":
                self._end(proc)
            self.lock.release()

    def _end(self, proc: subprocess.Popen, grace: float = 0.5) -> None:
        """Ends ``proc`` and forgets it: closes its pipes (EOF on its stdin ends a guard that
        is well), waits ``grace`` seconds, then kills it; never waits long (a process in
        uninterruptible I/O ends only when that does)."""
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        if self.proc is proc:
            self.proc = None
        if proc.poll() is None:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def close(self) -> None:
        """Ends the guard process (the caller holds the lock, or no thread reads)."""
        proc = self.proc
        if proc is not None and self.pid == os.getpid():
            self._end(proc, grace=5)
        self.proc = None

    def end(self) -> None:
        """Ends this guard for good: a request to it, now or later, raises (:meth:`_why_ended`).

        A read in progress holds the lock and reads the pipes: then only the process is killed
        here, and that read, finding the pipe's end, closes them and raises. Closed under it,
        it got a raw OSError, or read a descriptor number the next file opened was given."""
        self.ended = True
        if self.lock.acquire(blocking=False):
            try:
                self.close()
            finally:
                self.lock.release()
            return
        proc = self.proc
        if proc is not None and self.pid == os.getpid():
            proc.kill()
