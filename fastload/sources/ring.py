"""A ring of reused batch buffers, each lent again only when nobody touches it.

A buffer is rewritten only after (1) every decode task writing into it has finished —
also the tasks of an abandoned pass — and (2) the consumer released it, and (3) the
CUDA event recorded after its host-to-device copy, if any, has completed. Events
cannot notify, so the ring waits on the one it needs with ``synchronize()``.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..collate import alloc_batch, pinning_on
from ..targets import INT_LABELS, TargetSpec
from ..views import Images, SampleShape, batch_shape, map_images, shapes
from .pools import BatchBuffers, Need
from .waiting import Stop, wait_until


@dataclass
class RingBuffers:
    """The pinned (with CUDA) host memory of one batch."""

    images: Images  # a tuple of them for a multi-view batch
    labels: torch.Tensor  # the targets: N, or N×shape of the targets' spec
    indices: torch.Tensor


@dataclass
class _Buffer:
    buffers: RingBuffers
    held: bool = False  # lent to the consumer
    writers: Any = None  # the job writing into it: has ``finished()``
    event: Any = None  # CUDA event recorded after its copy
    released: int = 0  # release order: copies run in order, so the oldest event completes first
    lent: int = 0  # how many times it was lent: a lease of an earlier lending gives nothing back


class RingLease:
    """Gives a buffer back to its ring (see :class:`fastload.batch.Lease`): this lending of it
    only, so a late release (a batch of a pass that ended, after :meth:`BufferRing.release_all`)
    never frees the buffer lent since to another batch."""

    def __init__(self, ring: BufferRing, buffer: int) -> None:
        self._ring, self._buffer, self._lent = ring, buffer, ring.lent(buffer)

    def release(self, event: Any = None) -> None:
        self._ring.release(self._buffer, event, self._lent)


class BufferRing:
    """``count`` batch buffers of one shape, allocated once.

    Args:
        count: Number of buffers.
        shape: uint8 batch shape N×H×W×C (N = the batch size), or a tuple of them (one per view).
        pin: Pin the buffers (for asynchronous copies to CUDA).
        targets: dtype and per-sample shape of the targets (from the first sample).
    """

    def __init__(self, count: int, shape: SampleShape, pin: bool, targets: TargetSpec = INT_LABELS) -> None:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        per_view = shapes(shape)
        n = per_view[0][0]
        self.shape, self.target = tuple(shape), targets

        def place(s: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return alloc_batch(s, dtype, pin=pin)

        def images() -> Images:
            views = tuple(alloc_batch(v, pin=pin) for v in per_view)
            return views if isinstance(shape[0], tuple) else views[0]

        self._buffers = [
            _Buffer(RingBuffers(images(), targets.alloc(n, place), alloc_batch((n,), torch.int64, pin=pin)))
            for _ in range(count)
        ]
        self._cond = threading.Condition()
        self._releases = 0

    def __len__(self) -> int:
        return len(self._buffers)

    def buffers(self, buffer: int) -> RingBuffers:
        return self._buffers[buffer].buffers

    def acquire(self, writers: Any, stop: Stop | None = None) -> int:
        """A free buffer, now lent to ``writers`` (whose ``finished()`` gates its reuse) and
        then to the consumer; waits for one if none is free.

        Raises:
            RuntimeError: ``stop`` was set while waiting (the source closed: PassClosed).
        """
        got: list[int] = []

        def ready(seconds: float) -> bool:
            with self._cond:
                oldest: _Buffer | None = None
                for i, s in enumerate(self._buffers):
                    if s.held or (s.writers is not None and not s.writers.finished()):
                        continue
                    if s.event is None or s.event.query():
                        s.held, s.writers, s.event = True, writers, None
                        s.lent += 1
                        got.append(i)
                        return True
                    if oldest is None or s.released < oldest.released:
                        oldest = s
                # The copy released first was queued first: the shortest wait.
                if oldest is None:
                    # A release or close() notifies; writers finishing does not (seen at the next call).
                    self._cond.wait(seconds)
                    return False
                waiting_on = oldest.event
            waiting_on.synchronize()  # outside the lock: the copy ends on its own
            return False

        wait_until(ready, stop or Stop())
        return got[0]

    def lent(self, buffer: int) -> int:
        """How many times ``buffer`` has been lent (the lending a new lease of it is for)."""
        with self._cond:
            return self._buffers[buffer].lent

    def release(self, buffer: int, event: Any = None, lent: int | None = None) -> None:
        """Gives ``buffer`` back, reused once ``event`` (recorded after its copy) has passed; a
        release of an earlier lending than its last (``lent``) is ignored."""
        with self._cond:
            s = self._buffers[buffer]
            if lent is not None and lent != s.lent:
                return  # a batch of an ended pass, after release_all: the buffer is another's now
            self._releases += 1
            s.held, s.event, s.released = False, event, self._releases
            self._cond.notify_all()

    def wake(self) -> None:
        """A waiting ``acquire`` looks again now (the source closed), not at its next ``WAIT_S``."""
        with self._cond:
            self._cond.notify_all()

    def release_all(self) -> None:
        """Buffers an abandoned pass never gave back; their writers and events still gate them."""
        with self._cond:
            for s in self._buffers:
                s.held = False
            self._cond.notify_all()


def available_memory() -> int | None:
    """Bytes this machine can still give (``MemAvailable``), None where it is not known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(count: int, shape: SampleShape, targets: TargetSpec) -> None:
    """Refuses a ring of ``count`` batches that this machine's available memory cannot hold
    (a huge prefetch_factor), naming the option, before allocating it.

    Raises:
        ValueError: The ring would not fit.
    """
    per_view = shapes(shape)
    n = per_view[0][0]
    item = torch.empty(0, dtype=targets.dtype).element_size()
    nbytes = sum(math.prod(v) for v in per_view) + n * (math.prod(targets.shape) * item + 8)
    free = available_memory()
    if free is not None and count * nbytes > free:
        raise ValueError(
            f"prefetch_factor: the thread backend would hold {count} batches of {nbytes / 2**20:.1f} MB "
            f"({count * nbytes / 2**30:.1f} GB) ahead, more than this machine's available memory "
            f"({free / 2**30:.1f} GB); give a smaller prefetch_factor (2 is DataLoader's default), "
            "num_workers or batch_size"
        )


class RingPool:
    """The thread backend's :class:`~fastload.sources.pools.BufferPool`: a :class:`BufferRing`
    of ``count`` batches of ``batch_size`` rows, made (again) when the sample shape or the
    targets' spec of a pass differ from its own.

    Args:
        count: Buffers in the ring.
        batch_size: Rows of each buffer (a short batch uses the first rows).
        pin: Pin the buffers (for asynchronous copies to CUDA).
        device: The CUDA device they are pinned for (see :func:`fastload.collate.pinning_on`).
        closed: Set when the source closes: a lease waiting for a buffer gives up.
    """

    def __init__(self, count: int, batch_size: int, pin: bool, device: Any, closed: threading.Event) -> None:
        self.count, self.batch_size, self.pin, self.device, self.closed = count, batch_size, pin, device, closed
        self.ring: BufferRing | None = None

    def lease(self, need: Need) -> BatchBuffers:
        shape, target = batch_shape(self.batch_size, need.sample), need.target
        ring = self.ring
        if (
            ring is None
            or ring.shape != shape
            or (target is not None and ring.target != target)
            or len(ring) < self.count  # a pass with more batches than the ring was made for
        ):
            check_fits(self.count, shape, target or INT_LABELS)
            with pinning_on(self.device if self.pin else None):
                ring = self.ring = BufferRing(self.count, shape, self.pin, target or INT_LABELS)
        buffer = ring.acquire(need.until, Stop(self.closed))
        buffers = ring.buffers(buffer)
        images = map_images(lambda t: t[: need.n], buffers.images)
        return BatchBuffers(images, buffers.labels, buffers.indices, ring.target, RingLease(ring, buffer))

    def abandon(self, buffers: BatchBuffers, worker: int = 0) -> None:
        """Gives the buffer back (reused once its writers have finished)."""
        if buffers.lease is not None:
            buffers.lease.release()

    def reset(self, ahead: int) -> None:
        """A ring of ``ahead`` buffers from the next lease on; the buffers an abandoned pass never
        gave back are free again (their writers and events still gate them)."""
        self.count = ahead
        if self.ring is not None:
            self.ring.release_all()

    def close(self) -> None:
        """Lets the ring go: its buffers go when the last batch holding one does (a lease
        waiting for one gives up: the source's closed event is set)."""
        ring, self.ring = self.ring, None
        if ring is not None:
            ring.wake()  # wakes a lease waiting, which then sees the closed event
