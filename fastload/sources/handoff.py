"""Batch buffers a worker process reuses instead of new shared memory for every batch.

A new shared-memory batch costs its worker a page fault and a zeroed page every 4 KiB
(shared memory gets no huge pages), and the main process as many faults again when it
reads the batch, then both unmap it. ``benchmarks/bench_handoff.py`` measured 25 ms of
CPU per 128×224×224×3 batch that way against 10 ms with a reused buffer copied out on
arrival: about 115 µs per image, a tenth of what the training pipeline spends on one.

So each worker keeps a few buffers, and a flag per buffer in a table shared with
the main process says whether the main process is done with it. The main process copies
each batch out of its buffer as soon as it receives it (DataLoader's pin-memory thread
into pinned memory, else :func:`detached`) and frees the buffer then; a batch that
DataLoader drops unread (a pass cut short) frees its buffer when it is collected. Buffers
never make a worker wait: with none free, it builds the batch in its own memory, which
travels by value (a copy through the pipe).

The buffers and the flags are memfd segments the main process makes
(:mod:`fastload.sources.segments`): nothing of them is in ``/dev/shm``, a batch in a buffer
travels as its buffer's number (the main process maps the same memory), and the memory goes
when the table is closed and the workers are gone, however they ended. Where memfd is
missing (not Linux), there are no buffers: workers send torch shared memory as before.
"""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
import weakref
from typing import Any, TypeVar

import numpy as np
import torch

from ..batch import HostBatch, SharedLease
from ..collate import alloc_batch
from ..encoded import EncodedBatch, SourceBatch
from ..views import Images, SampleShape, batch_shape, map_images, of_views, shapes
from .pools import BatchBuffers, Need
from .segments import SUPPORTED, Segments

FREE = 0  # a busy buffer holds the pid of the worker process that lent it
_REUSED, _NEW = -2, -1  # counter columns after the flags: batches in a reused buffer, in a new buffer

#: The tables of this process, by id: a lease that arrives from a worker finds its table here.
_TABLES: weakref.WeakValueDictionary[str, BufferTable] = weakref.WeakValueDictionary()


def worker_buffers(prefetch_factor: int, packed: bool) -> int:
    """The buffers each worker keeps: its ``prefetch_factor`` batches in flight, one being copied
    out of its buffer, and one more that spares a fresh one when a copy-out lags; twice that for
    batches ``packed`` for the GPU, each of which leases two (its bytes, its CPU-decoded rows)."""
    return (prefetch_factor + 2) * (2 if packed else 1)


class BufferTable:
    """A row of buffer flags per worker and the buffers themselves, in memfd segments made by
    the main process before the workers start.

    Args:
        workers: Worker processes.
        per_worker: Buffers each worker may keep (enough for the batches it can have in flight).
    """

    supported = SUPPORTED

    def __init__(self, workers: int, per_worker: int) -> None:
        if workers < 1 or per_worker < 1:
            raise ValueError(f"workers and per_worker must be >= 1, got {workers} and {per_worker}")
        # Segment 0 holds the flags; segment 1 + w * per_worker + k is worker w's buffer k.
        segments = Segments(f"fastload-buffers-{os.getpid()}", 1 + workers * per_worker)
        self._setup(uuid.uuid4().hex, workers, per_worker, segments)

    def renewed(self) -> BufferTable:
        """A table of the same size with every buffer free, for a new generation of workers (buffers
        the old one lost with a killed worker or an unread batch are not carried over). Close
        this one once its workers are gone."""
        return BufferTable(self.workers, self.per_worker)

    def _setup(self, table_id: str, workers: int, per_worker: int, segments: Segments) -> None:
        self.id, self.workers, self.per_worker, self._segments = table_id, workers, per_worker, segments
        try:
            nbytes = workers * (per_worker + 2) * 8
            flags = segments.map(0, nbytes, grow=True)
            self._rows = flags[:nbytes].view(torch.int64).numpy().reshape(workers, per_worker + 2)
        except OSError:  # not reachable from here (a hardened /proc): every batch in a new buffer
            self._rows = np.zeros((workers, per_worker + 2), dtype=np.int64)
            self._rows[:, :per_worker] = -3  # never FREE
        _TABLES[table_id] = self

    def __getstate__(self) -> tuple[str, int, int, Segments]:
        return self.id, self.workers, self.per_worker, self._segments

    def __setstate__(self, state: tuple[str, int, int, Segments]) -> None:
        self._setup(*state)

    @property
    def counts(self) -> tuple[int, int]:
        """(batches built in a reused buffer, batches built in a new buffer), all workers."""
        return int(self._rows[:, _REUSED].sum()), int(self._rows[:, _NEW].sum())

    def _view(self, worker: int, buffer: int, shape: SampleShape, grow: bool) -> Images:
        """The buffer's memory viewed as ``shape``: one tensor, or one per view, one after another."""
        per_view = shapes(shape)
        sizes = [math.prod(v) for v in per_view]
        mapped = self._segments.map(1 + worker * self.per_worker + buffer, sum(sizes), grow)
        flat = mapped[: sum(sizes)]
        views = [part.view(v) for part, v in zip(flat.split(sizes), per_view)]
        return tuple(views) if len(views) > 1 or of_views(shape) else views[0]

    def buffer(self, worker: int, shape: SampleShape) -> tuple[Images, BufferLease | None]:
        """A uint8 tensor of ``shape`` for worker ``worker``'s next batch: a free buffer of its
        own (with the lease that frees it), else memory of this process (no lease). A tuple of
        shapes (a multi-view batch) gives a tuple of tensors, one after another in one buffer."""
        row = self._rows[worker]
        shape = _canonical(shape)
        nbytes = sum(math.prod(v) for v in shapes(shape))
        for k in range(self.per_worker if nbytes else 0):
            if row[k] != FREE:
                continue
            reused = self._segments.mapped(1 + worker * self.per_worker + k) >= nbytes
            try:
                images = self._view(worker, k, shape, grow=True)
            except OSError:  # cannot be reached or grown (no memory): this batch by value instead
                break
            row[_REUSED] += reused
            row[k] = os.getpid()
            return images, BufferLease(self.id, worker, k, os.getpid(), shape)
        row[_NEW] += 1
        # Not shared memory: it travels by value (fastload.batch), so nothing is left behind
        # in /dev/shm when it is never received.
        own = tuple(torch.from_numpy(np.empty(v, dtype=np.uint8)) for v in shapes(shape))
        return (own if of_views(shape) else own[0]), None

    def images(self, worker: int, buffer: int, shape: SampleShape) -> Images:
        """The pixels a worker left in its buffer, as this process maps them."""
        return self._view(worker, buffer, _canonical(shape), grow=False)

    def free(self, worker: int, buffer: int, owner: int) -> None:
        """Frees the buffer if process ``owner`` still holds it: a late release of a batch of a
        dead worker must not free the buffer its successor (same worker number) has lent since."""
        if self._rows[worker, buffer] == owner:
            self._rows[worker, buffer] = FREE

    def close(self) -> None:
        """Lets go of the segments here (idempotent): their memory goes once the workers that
        use them are gone and no batch still views a buffer."""
        self._rows = self._rows.copy()  # the flags' mapping goes too; a late release writes here, harmlessly
        self._segments.close()


class BufferLease(SharedLease):
    """Worker ``worker``'s buffer ``buffer`` of table ``table_id``, lent with one batch of ``shape``
    by process ``owner``.

    The batch's pixels travel as this lease (see :meth:`images`): the main process maps the
    buffer. Only the copy that arrives in the main process frees the buffer: on :meth:`release`,
    or when it is collected unreleased (its batch was dropped unread).
    """

    def __init__(
        self, table_id: str, worker: int, buffer: int, owner: int, shape: SampleShape = (), received: bool = False
    ) -> None:
        self.table_id, self.worker, self.buffer, self.owner = table_id, worker, buffer, int(owner)
        self.shape = _canonical(shape)
        self._open = received

    def __reduce__(self) -> tuple[Any, tuple[str, int, int, int, SampleShape, bool]]:
        return BufferLease, (self.table_id, self.worker, self.buffer, self.owner, self.shape, True)

    def images(self) -> Images:
        """The batch's pixels in the buffer, mapped in this process.

        Raises:
            RuntimeError: This process no longer holds the buffer table (its workers were replaced).
        """
        table = _TABLES.get(self.table_id)
        if table is None:
            raise RuntimeError(
                f"a batch arrived in a buffer of table {self.table_id}, which this process no longer holds"
            )
        return table.images(self.worker, self.buffer, self.shape)

    def release(self, event: Any = None) -> None:
        if not self._open:
            return
        self._open = False
        if event is not None:  # a copy out of the buffer may still be running
            event.synchronize()
        table = _TABLES.get(self.table_id)
        if table is not None:
            table.free(self.worker, self.buffer, self.owner)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # at interpreter exit the table may be gone already
            pass


class SharedPool:
    """The :class:`~fastload.sources.pools.BufferPool` of worker processes: each worker's own
    buffers of ``table`` (a batch that finds none free is built in the worker's own memory).

    Args:
        table: The buffers, made by the main process before the workers start.
    """

    def __init__(self, table: BufferTable) -> None:
        self.table = table

    def lease(self, need: Need) -> BatchBuffers:
        images, lease = self.table.buffer(need.worker, batch_shape(need.n, need.sample))
        return BatchBuffers(images, lease=lease)

    def abandon(self, buffers: BatchBuffers, worker: int = 0) -> None:
        """Frees the buffer of a batch that was never sent."""
        lease = buffers.lease
        if isinstance(lease, BufferLease):
            self.table.free(worker, lease.buffer, lease.owner)

    def reset(self, ahead: int) -> None:
        """Fresh buffers for a new generation of workers (the old ones' memory goes with them)."""
        old, self.table = self.table, self.table.renewed()
        old.close()  # forked workers inherited descriptors of their own

    def close(self) -> None:
        self.table.close()


def detached(batch: SourceBatch) -> SourceBatch:
    """``batch`` with what it holds in workers' buffers copied out and the buffers freed (the
    images of a HostBatch; the bytes and decoded rows of an EncodedBatch); ``batch`` itself
    when its memory is its own."""
    if isinstance(batch, HostBatch):
        if not isinstance(batch.lease, BufferLease):
            return batch
        own: SourceBatch = dataclasses.replace(batch, images=_own(batch.images, batch.lease), lease=None)
    elif isinstance(batch, EncodedBatch) and (batch.data_lease is not None or batch.decoded_lease is not None):
        own = dataclasses.replace(
            batch,
            data=_own(batch.data, batch.data_lease),
            decoded=_own(batch.decoded, batch.decoded_lease),
            data_lease=None,
            decoded_lease=None,
        )
    else:
        return batch
    batch.release()
    return own


_Held = TypeVar("_Held", torch.Tensor, Images)


def _own(images: _Held, lease: Any) -> _Held:
    """``images`` copied into memory of their own where a worker's buffer holds them (``lease``)."""
    if lease is None:
        return images
    return map_images(copied, images)


def copied(t: torch.Tensor) -> torch.Tensor:
    """A copy of the CPU tensor ``t`` made by the calling thread alone.

    ``Tensor.copy_`` splits a large copy over torch's intra-op threads, and after each such
    copy the main thread's OpenMP team spins waiting for more work: CPU the loader's workers
    need. With decode="gpu" that spinning was most of the main process's CPU time
    (``benchmarks/RESULTS.md``, "GPU decode: the main thread's OpenMP team"). numpy copies
    on this thread only (without the GIL), and a memory-bound copy gains little from more.
    """
    try:
        out = alloc_batch(t.shape, dtype=t.dtype, pin=False)
        np.copyto(out.numpy(), t.numpy())
    except TypeError:  # a dtype numpy lacks (bfloat16): torch's copy
        out = torch.empty(t.shape, dtype=t.dtype).copy_(t)
    return out


def _canonical(shape: Any) -> SampleShape:
    """``shape`` as plain ints: a tuple, or a tuple of tuples (one per view)."""
    if len(shape) and isinstance(shape[0], (tuple, list, torch.Size)):
        return tuple(tuple(int(s) for s in v) for v in shape)
    return tuple(int(s) for s in shape)
