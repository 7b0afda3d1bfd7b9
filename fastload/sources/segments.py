"""Shared memory that no file name holds: Linux memfd segments, reached by descriptor.

torch's shared memory for DataLoader workers (the "file_system" strategy, which fastload's
workers use so that a stopped worker cannot stall the consumer) lives in ``/dev/shm`` under
names removed only when every process that mapped a segment lets go of it in an orderly way.
A worker that exits (``os._exit``: no destructors) or is killed, and a batch sent but never
received, leave their segments there until the program ends: 100 loaders closed after one
batch each left 840 MB (issue 28). And ``/dev/shm`` is small in containers (Docker: 64 MB).

A memfd has no name. The kernel frees its memory when the last descriptor and mapping are
gone, however the processes holding them end, and it is not in ``/dev/shm``: it counts as the
program's memory (under a container's memory limit, not under ``--shm-size``). The process
that makes a segment keeps its descriptor; a worker started by fork inherits it, one started
by spawn or forkserver opens ``/proc/<maker>/fd/<n>``.
"""

from __future__ import annotations

import mmap
import os

#: memfd segments can be made and reached here (Linux): elsewhere workers use torch's shared memory.
SUPPORTED = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class Segments:
    """A fixed number of memfd segments of one maker process, each grown on demand.

    Args:
        name: Shown in ``/proc/<pid>/maps`` and ``/proc/<pid>/fd`` (``memfd:<name>.<i>``).
        count: How many segments.

    Pickled (to a process started by spawn or forkserver), it carries the maker's pid and
    descriptor numbers; the receiver opens each segment through ``/proc`` on first use.
    A forked child uses the inherited descriptors as they are.
    """

    def __init__(self, name: str, count: int) -> None:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        fds = [os.memfd_create(f"{name}.{i}", os.MFD_CLOEXEC) for i in range(count)]
        self._setup(os.getpid(), fds, reached=False)

    def _setup(self, maker: int, fds: list[int], reached: bool) -> None:
        self.maker, self._fds = maker, fds
        self._local: dict[int, int] = {} if reached else dict(enumerate(fds))  # i -> a descriptor of this process
        self._maps: dict[int, mmap.mmap] = {}
        self._reached, self._closed = reached, False

    def __len__(self) -> int:
        return len(self._fds)

    def __getstate__(self) -> tuple[int, list[int]]:
        return self.maker, self._fds

    def __setstate__(self, state: tuple[int, list[int]]) -> None:
        self._setup(*state, reached=True)

    def _fd(self, i: int) -> int:
        fd = self._local.get(i)
        if fd is None:
            if self._closed:
                raise OSError(f"segment {i} of process {self.maker} was closed in this process")
            # The maker's descriptor, opened anew: same memory, this process's own descriptor.
            fd = self._local[i] = os.open(f"/proc/{self.maker}/fd/{self._fds[i]}", os.O_RDWR | os.O_CLOEXEC)
        return fd

    def mapped(self, i: int) -> int:
        """Bytes of segment ``i`` mapped in this process so far (0: none)."""
        mapped = self._maps.get(i)
        return len(mapped) if mapped is not None else 0

    def map(self, i: int, nbytes: int, grow: bool = False) -> mmap.mmap:
        """A mapping of at least ``nbytes`` of segment ``i``; with ``grow``, the segment is first
        enlarged to ``nbytes`` with its pages reserved (an error here, not SIGBUS on a write).

        Raises:
            OSError: The segment cannot be reached or grown (e.g. ENOMEM).
        """
        mapped = self._maps.get(i)
        if mapped is not None and len(mapped) >= nbytes:
            return mapped
        fd = self._fd(i)
        size = os.fstat(fd).st_size
        if size < nbytes:
            if not grow:
                raise OSError(f"segment {i} holds {size} bytes, {nbytes} wanted")
            os.posix_fallocate(fd, 0, nbytes)
            size = nbytes
        # Mappings already handed out stay valid: each mmap lives while a tensor views it.
        mapped = self._maps[i] = mmap.mmap(fd, max(size, 1))
        return mapped

    def close(self) -> None:
        """Closes this process's descriptors (idempotent). Mappings stay valid while in use;
        the memory goes when no process holds a descriptor or a mapping of it."""
        self._closed = True
        local, self._local = self._local, {}
        self._maps = {}
        for fd in local.values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit os may be gone already
            pass
