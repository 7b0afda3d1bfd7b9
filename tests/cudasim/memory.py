"""The device's caching allocator and pinned host memory, as the simulator models them.

Caching allocator (modelled on PyTorch's): an allocation belongs to the stream current at
its ``malloc``. When its last tensor dies the block goes back to a free list of that
stream and the next allocation of the same size *on the same stream* gets it (its
:class:`~cudasim.clocks.Location`, with the accesses made through the old tensor) with no
wait: work on one stream runs in order, so that is safe for that stream only. A block that
was ``record_stream``-ed on other streams is held back until the work those streams had
queued when it was freed is known complete to the host (adversarial: only once the host
waited on it; under a seed, sometimes earlier). Blocks match by exact byte size (the real
allocator rounds and splits; not modelled). ``capacity`` makes an allocation beyond it
raise ``torch.cuda.OutOfMemoryError`` after the free lists were emptied, as the real one
does.

Pinned host memory: tensors whose storage is a numpy array registered here, by the
storage's address, for as long as the array lives. Nothing else about pinning is modelled.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .clocks import Clock, Location

_ids = itertools.count()


@dataclass(eq=False)
class Memory:
    """A device block: its size, the stream it was allocated on, the streams recorded on it."""

    device: torch.device
    stream: Any  # SimStream
    nbytes: int
    location: Location
    uses: set = field(default_factory=set)  # record_stream'ed streams


class Block:
    """The handle the tensors of one allocation share; its death frees the block."""

    def __init__(self, allocator: CachingAllocator, memory: Memory) -> None:
        self.allocator, self.memory = allocator, memory

    def __del__(self) -> None:
        try:
            self.allocator.free(self.memory)
        except Exception:  # interpreter exit
            pass


class CachingAllocator:
    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.free_lists: dict[tuple, list[tuple[Memory, Clock]]] = {}
        self.allocated: dict[int, int] = {}
        self.cached: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.external: dict[int, int] = {}  # memory outside torch's allocator (a decoder's pools)
        self.capacity: int | None = None
        self.reused = 0
        self.live = True

    def allocate(self, device: torch.device, stream: Any, nbytes: int, what: str) -> Memory:
        key = (device.index, stream.agent, nbytes)
        candidates = self.free_lists.get(key, [])
        for k, (memory, pending) in enumerate(candidates):
            if self.sim.completes(pending):  # the events of the record_stream'ed streams passed
                del candidates[k]
                memory.uses = set()
                self.cached[device.index] -= nbytes
                self.reused += 1
                self._count(device.index, nbytes)
                return memory
        used = self.allocated.get(device.index, 0) + self.cached.get(device.index, 0) + nbytes
        if self.capacity is not None and used > self.capacity:
            self.empty_cache()
            if self.allocated.get(device.index, 0) + nbytes > self.capacity:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory (simulated). Tried to allocate {nbytes} bytes on {device}")
        self._count(device.index, nbytes)
        return Memory(device, stream, nbytes, Location(f"block#{next(_ids)} ({what}, {device})"))

    def _count(self, index: int, nbytes: int) -> None:
        self.allocated[index] = self.allocated.get(index, 0) + nbytes
        self.peak[index] = max(self.peak.get(index, 0), self.allocated[index])

    def free(self, memory: Memory) -> None:
        if not self.live:
            return
        with self.sim.lock:
            index = memory.device.index
            self.allocated[index] -= memory.nbytes
            self.cached[index] = self.cached.get(index, 0) + memory.nbytes
            # The events record_stream asks for: each other stream's work queued by now.
            pending = Clock()
            for s in memory.uses:
                if s is not memory.stream:
                    pending.join(s.clock)
            key = (index, memory.stream.agent, memory.nbytes)
            self.free_lists.setdefault(key, []).append((memory, pending))

    def empty_cache(self) -> None:
        for key, blocks in self.free_lists.items():
            self.cached[key[0]] -= sum(m.nbytes for m, _ in blocks)
        self.free_lists.clear()

    def reserved(self, index: int) -> int:
        return self.allocated.get(index, 0) + self.cached.get(index, 0)


class PinnedHost:
    """Host tensors in "pinned" memory: numpy-backed, registered by storage address."""

    def __init__(self) -> None:
        self._addresses: set[int] = set()

    def empty(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * itemsize)
        array = np.empty(nbytes, np.uint8)
        address = array.ctypes.data
        self._addresses.add(address)
        weakref.finalize(array, self._addresses.discard, address)
        flat = torch.from_numpy(array)
        return flat[: nbytes - nbytes % itemsize].view(dtype)[: int(np.prod(shape, dtype=np.int64))].view(shape)

    def copy_of(self, t: torch.Tensor) -> torch.Tensor:
        out = self.empty(tuple(t.shape), t.dtype)
        out.copy_(t)
        return out

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self._addresses
