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

Descriptors: the maker holds one per segment (a Loader with the process backend: one per
worker buffer and one for their flags, ``1 + workers × (prefetch_factor + 2)``); mappings hold
none (torch maps the segment and closes what it opened; Python's mmap would keep a duplicate
descriptor per mapping).
"""

from __future__ import annotations

import errno
import os

import torch

from .descriptors import descriptor_limit

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
        fds: list[int] = []
        try:
            for i in range(count):
                fds.append(os.memfd_create(f"{name}.{i}", os.MFD_CLOEXEC))
        except OSError as e:
            for fd in fds:  # none of them is anyone's yet
                os.close(fd)
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise descriptor_limit(e, f"making {count} shared-memory segments for worker buffers") from None
            raise
        self._setup(os.getpid(), fds, reached=False)

    def _setup(self, maker: int, fds: list[int], reached: bool) -> None:
        self.maker, self._fds = maker, fds
        self._local: dict[int, int] = {} if reached else dict(enumerate(fds))  # i -> a descriptor of this process
        self._maps: dict[int, torch.Tensor] = {}
        self._reached, self._closed = reached, False

    def __len__(self) -> int:
        return len(self._fds)

    def __getstate__(self) -> tuple[int, list[int]]:
        return self.maker, self._fds

    def __setstate__(self, state: tuple[int, list[int]]) -> None:
        self._setup(*state, reached=True)

    def _path(self, i: int) -> str:
        """A path that opens segment ``i``: this process's descriptor, else the maker's."""
        fd = self._local.get(i)
        if fd is not None:
            return f"/proc/self/fd/{fd}"
        if self._closed or not self._reached:
            raise OSError(f"segment {i} of process {self.maker} was closed in this process")
        return f"/proc/{self.maker}/fd/{self._fds[i]}"

    def mapped(self, i: int) -> int:
        """Bytes of segment ``i`` mapped in this process so far (0: none)."""
        mapped = self._maps.get(i)
        return mapped.numel() if mapped is not None else 0

    def map(self, i: int, nbytes: int, grow: bool = False) -> torch.Tensor:
        """A uint8 tensor over at least ``nbytes`` of segment ``i``; with ``grow``, the segment is
        first enlarged to ``nbytes`` with its pages reserved (an error here, not SIGBUS on a write).

        Raises:
            OSError: The segment cannot be reached or grown (e.g. ENOMEM).
        """
        mapped = self._maps.get(i)
        if mapped is not None and mapped.numel() >= nbytes:
            return mapped
        path = self._path(i)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                if not grow:
                    raise OSError(f"segment {i} holds {size} bytes, {nbytes} wanted")
                os.posix_fallocate(fd, 0, nbytes)
                size = nbytes
        finally:
            os.close(fd)
        # Mappings already handed out stay valid: each lives while a tensor views it.
        mapped = self._maps[i] = torch.from_file(path, shared=True, size=max(size, 1), dtype=torch.uint8)
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
