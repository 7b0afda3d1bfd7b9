"""LMDB reads in a separate reader process, so a damaged or shrinking data file is an error, never a signal.

lmdb maps the data file and follows page numbers from it: a file truncated while mapped
is SIGBUS at the first page past its new end, and a flipped bit in a B-tree page can send
it to an address outside the map (SIGSEGV). No check before a read closes the window
between the check and the page access, and no Python code survives either signal, so
the reads happen in a small child process (:mod:`.lmdb_child`, one per reading thread,
started on first use, about 0.1 s). When it dies, the read is a ValueError that names
the file, the key and the signal, and says whether the file is now shorter than its
header requires; the next read starts a new reader. A reader that does not answer in
``timeout`` seconds (a loop in a damaged tree) is killed the same way.

Cost: a request and a copy of the value through a pipe, some tens of microseconds per
sample beside milliseconds of decoding.
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
import weakref
from collections.abc import Iterator

from .lmdb_size import DataFile, data_file_path, truncated_message

U32, U64 = struct.Struct("<I"), struct.Struct("<Q")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lmdb_child.py")
DEFAULT_TIMEOUT = 60.0


class ReaderDied(ValueError):
    """The reader process of an LMDB died or stopped answering (a damaged or truncated file)."""


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass


class LMDBReader:
    """One reader process for the LMDB at ``path``.

    Args:
        path: The LMDB (a folder holding data.mdb, or the file).
        data: What its data file must hold (from :func:`.lmdb_size.check_data_file`).
        options: ``lmdb.open`` keywords (plain values: they travel as JSON).
        timeout: Seconds a reply may take before the reader is killed.

    Raises:
        ValueError: The reader could not open the LMDB (lmdb's message, naming the path).
    """

    def __init__(self, path: str, data: DataFile | None, options: dict, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.path, self.data, self.timeout, self.pid = path, data, timeout, os.getpid()
        file = data.path if data is not None else data_file_path(path)
        required = data.required if data is not None else 0
        try:
            encoded = json.dumps({"subdir": os.path.isdir(path), **options})
        except TypeError as e:
            raise TypeError(f"LMDB options must be plain values to reach the reader process: {e}") from None
        self.proc = subprocess.Popen([sys.executable, CHILD, path, file, str(required), encoded],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     bufsize=0)
        self._finalizer = weakref.finalize(self, _kill, self.proc)
        self._buf = bytearray()
        status = self._take(1, "opening it")
        if status == b"E":
            raise ValueError(f"LMDB {path}: {self._message()}")

    def _died(self, what: str) -> ReaderDied:
        code = self.proc.poll()
        self.close()
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else \
            f"exited with {code}" if code is not None else f"did not answer in {self.timeout} s and was killed"
        if self.data is not None:
            size = os.stat(self.data.path).st_size if os.path.exists(self.data.path) else 0
            if size < self.data.required:
                return ReaderDied(truncated_message(self.data.path, size, self.data.required, self.data.page_size)
                                  + f" (its reader process {how} {what})")
        return ReaderDied(f"LMDB {self.path}: its reader process {how} {what}: the data file is damaged "
                          "(a corrupt page); copy or convert it again")

    def _take(self, n: int, what: str) -> bytes:
        """Exactly ``n`` bytes of the reply, waiting at most ``timeout`` for each piece."""
        fd = self.proc.stdout.fileno()
        while len(self._buf) < n:
            ready, _, _ = select.select([fd], [], [], self.timeout)
            chunk = os.read(fd, max(n - len(self._buf), 1 << 16)) if ready else b""
            if not chunk:
                raise self._died(what)
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _message(self) -> str:
        raw = self._take(U32.unpack(self._take(4, "replying"))[0], "replying")
        text = raw.decode("utf-8", "replace")
        if text.startswith("TRUNCATED") and self.data is not None:
            size = os.stat(self.data.path).st_size
            return truncated_message(self.data.path, size, self.data.required, self.data.page_size)
        return text

    def _send(self, request: bytes, what: str) -> None:
        try:
            self.proc.stdin.write(request)
        except (BrokenPipeError, OSError):
            raise self._died(what) from None

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` (None: no such key).

        Raises:
            ReaderDied: The reader died or hung on it (named, with the file's state).
            ValueError: lmdb reported an error (a corrupt page it noticed).
        """
        what = f"reading key {key!r}"
        self._send(b"G" + U32.pack(len(key)) + key, what)
        status = self._take(1, what)
        if status == b"N":
            return None
        if status == b"E":
            raise ValueError(f"LMDB {self.path}: {what}: {self._message()}")
        return self._take(U64.unpack(self._take(8, what))[0], what)

    def count(self) -> int:
        self._send(b"C", "counting entries")
        if self._take(1, "counting entries") == b"E":
            raise ValueError(f"LMDB {self.path}: counting entries: {self._message()}")
        return int(self._take(U64.unpack(self._take(8, "counting entries"))[0], "counting entries"))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value), in key order. Read it to the end before any other request."""
        what = "listing its records"
        self._send(b"S", what)
        while True:
            status = self._take(1, what)
            if status == b"D":
                return
            if status == b"E":
                raise ValueError(f"LMDB {self.path}: {what}: {self._message()}")
            key = self._take(U32.unpack(self._take(4, what))[0], what)
            yield key, self._take(U64.unpack(self._take(8, what))[0], f"reading key {key!r}")

    def close(self) -> None:
        self._finalizer()


_local = threading.local()


def reader(path: str, data: DataFile | None, options: dict, timeout: float = DEFAULT_TIMEOUT) -> LMDBReader:
    """This thread's reader of ``path`` (started now if it has none, or its last one died).

    A reader inherited through fork belongs to the parent: it is left alone (its pipes
    are closed in this process only) and a new one started.
    """
    readers: dict[str, LMDBReader] = _local.__dict__.setdefault("readers", {})
    found = readers.get(path)
    if found is not None and found.pid == os.getpid() and found.proc.poll() is None:
        return found
    if found is not None and found.pid != os.getpid():
        found._finalizer.detach()
        for stream in (found.proc.stdin, found.proc.stdout):
            stream.close()
    elif found is not None:
        found.close()
    readers[path] = made = LMDBReader(path, data, options, timeout)
    return made


def close_readers(path: str) -> None:
    """Stops this thread's reader of ``path``."""
    found = _local.__dict__.get("readers", {}).pop(path, None)
    if found is not None and found.pid == os.getpid():
        found.close()
