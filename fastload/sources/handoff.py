"""Batch buffers a worker process reuses instead of new shared memory for every batch.

A new shared-memory batch costs its worker a page fault and a zeroed page every 4 KiB
(shared memory gets no huge pages), and the main process as many faults again when it
reads the batch, then both unmap it. ``benchmarks/bench_handoff.py`` measured 25 ms of
CPU per 128×224×224×3 batch that way against 10 ms with a reused slot copied out on
arrival: about 115 µs per image, a tenth of what the training pipeline spends on one.

So each worker keeps a few buffers (slots), and a flag per slot in a table shared with
the main process says whether the main process is done with it. The main process copies
each batch out of its slot as soon as it receives it (DataLoader's pin-memory thread
into pinned memory, else :func:`detached`) and frees the slot then; a batch that
DataLoader drops unread (a pass cut short) frees its slot when it is collected. Slots
never make a worker wait: with none free, it builds the batch in its own memory, which
travels by value (a copy through the pipe).

The slots and the flags are memfd segments the main process makes
(:mod:`fastload.sources.segments`): nothing of them is in ``/dev/shm``, a batch in a slot
travels as its slot's number (the main process maps the same memory), and the memory goes
when the table is closed and the workers are gone, however they ended. Where memfd is
missing (not Linux), there are no slots: workers send torch shared memory as before.
"""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
import weakref
from typing import Any

import numpy as np
import torch

from ..batch import HostBatch
from ..collate import alloc_batch
from ..views import Images, SampleShape, map_images, shapes
from .segments import SUPPORTED, Segments

FREE = 0  # a busy slot holds the pid of the worker process that lent it
_REUSED, _NEW = -2, -1  # counter columns after the flags: batches in a reused slot, in a new buffer

#: The tables of this process, by id: a lease that arrives from a worker finds its table here.
_TABLES: weakref.WeakValueDictionary[str, SlotTable] = weakref.WeakValueDictionary()


class SlotTable:
    """A row of slot flags per worker and the slots themselves, in memfd segments made by
    the main process before the workers start.

    Args:
        workers: Worker processes.
        slots: Buffers each worker may keep (enough for the batches it can have in flight).
    """

    supported = SUPPORTED

    def __init__(self, workers: int, slots: int) -> None:
        if workers < 1 or slots < 1:
            raise ValueError(f"workers and slots must be >= 1, got {workers} and {slots}")
        # Segment 0 holds the flags; segment 1 + w * slots + k is worker w's slot k.
        segments = Segments(f"fastload-slots-{os.getpid()}", 1 + workers * slots)
        self._setup(uuid.uuid4().hex, workers, slots, segments)

    def renewed(self) -> SlotTable:
        """A table of the same size with every slot free, for a new generation of workers (slots
        the old one lost with a killed worker or an unread batch are not carried over). Close
        this one once its workers are gone."""
        return SlotTable(self.workers, self.slots)

    def _setup(self, table_id: str, workers: int, slots: int, segments: Segments) -> None:
        self.id, self.workers, self.slots, self._segments = table_id, workers, slots, segments
        try:
            nbytes = workers * (slots + 2) * 8
            flags = segments.map(0, nbytes, grow=True)
            self._rows = flags[:nbytes].view(torch.int64).numpy().reshape(workers, slots + 2)
        except OSError:  # not reachable from here (a hardened /proc): every batch in a new buffer
            self._rows = np.zeros((workers, slots + 2), dtype=np.int64)
            self._rows[:, :slots] = -3  # never FREE
        _TABLES[table_id] = self

    def __getstate__(self) -> tuple[str, int, int, Segments]:
        return self.id, self.workers, self.slots, self._segments

    def __setstate__(self, state: tuple[str, int, int, Segments]) -> None:
        self._setup(*state)

    @property
    def counts(self) -> tuple[int, int]:
        """(batches built in a reused slot, batches built in a new buffer), all workers."""
        return int(self._rows[:, _REUSED].sum()), int(self._rows[:, _NEW].sum())

    def _slot(self, worker: int, slot: int, shape: SampleShape, grow: bool) -> Images:
        """The slot's memory viewed as ``shape``: one tensor, or one per view, one after another."""
        per_view = shapes(shape)
        sizes = [math.prod(v) for v in per_view]
        mapped = self._segments.map(1 + worker * self.slots + slot, sum(sizes), grow)
        flat = mapped[: sum(sizes)]
        views = [part.view(v) for part, v in zip(flat.split(sizes), per_view)]
        return tuple(views) if len(views) > 1 or _multi(shape) else views[0]

    def buffer(self, worker: int, shape: SampleShape) -> tuple[Images, SlotLease | None]:
        """A uint8 tensor of ``shape`` for worker ``worker``'s next batch: a free slot of its
        own (with the lease that frees it), else memory of this process (no lease). A tuple of
        shapes (a multi-view batch) gives a tuple of tensors, one after another in one slot."""
        row = self._rows[worker]
        shape = _canonical(shape)
        nbytes = sum(math.prod(v) for v in shapes(shape))
        for k in range(self.slots if nbytes else 0):
            if row[k] != FREE:
                continue
            reused = self._segments.mapped(1 + worker * self.slots + k) >= nbytes
            try:
                images = self._slot(worker, k, shape, grow=True)
            except OSError:  # cannot be reached or grown (no memory): this batch by value instead
                break
            row[_REUSED] += reused
            row[k] = os.getpid()
            return images, SlotLease(self.id, worker, k, os.getpid(), shape)
        row[_NEW] += 1
        # Not shared memory: it travels by value (fastload.batch), so nothing is left behind
        # in /dev/shm when it is never received.
        own = tuple(torch.from_numpy(np.empty(v, dtype=np.uint8)) for v in shapes(shape))
        return (own if _multi(shape) else own[0]), None

    def images(self, worker: int, slot: int, shape: SampleShape) -> Images:
        """The pixels a worker left in its slot, as this process maps them."""
        return self._slot(worker, slot, _canonical(shape), grow=False)

    def free(self, worker: int, slot: int, owner: int) -> None:
        """Frees the slot if process ``owner`` still holds it: a late release of a batch of a
        dead worker must not free the slot its successor (same worker number) has lent since."""
        if self._rows[worker, slot] == owner:
            self._rows[worker, slot] = FREE

    def close(self) -> None:
        """Lets go of the segments here (idempotent): their memory goes once the workers that
        use them are gone and no batch still views a slot."""
        self._rows = self._rows.copy()  # the flags' mapping goes too; a late release writes here, harmlessly
        self._segments.close()


class SlotLease:
    """Worker ``worker``'s slot ``slot`` of table ``table_id``, lent with one batch of ``shape``
    by process ``owner``.

    The batch's pixels travel as this lease (see :meth:`images`). Only the copy that arrives
    in the main process frees the slot: on :meth:`release`, or when it is collected
    unreleased (its batch was dropped unread).
    """

    travels = True  # a HostBatch may carry this lease to another process
    carries_images = True  # ... and its images are the slot's: the receiver maps them (fastload.batch)

    def __init__(
        self, table_id: str, worker: int, slot: int, owner: int, shape: SampleShape = (), received: bool = False
    ) -> None:
        self.table_id, self.worker, self.slot, self.owner = table_id, worker, slot, int(owner)
        self.shape = _canonical(shape)
        self._open = received

    def __reduce__(self) -> tuple[Any, tuple[str, int, int, int, SampleShape, bool]]:
        return SlotLease, (self.table_id, self.worker, self.slot, self.owner, self.shape, True)

    def images(self) -> Images:
        """The batch's pixels in the slot, mapped in this process.

        Raises:
            RuntimeError: This process no longer holds the slot table (its workers were replaced).
        """
        table = _TABLES.get(self.table_id)
        if table is None:
            raise RuntimeError(
                f"a batch arrived in a slot of table {self.table_id}, which this process no longer holds"
            )
        return table.images(self.worker, self.slot, self.shape)

    def release(self, event: Any = None) -> None:
        if not self._open:
            return
        self._open = False
        if event is not None:  # a copy out of the slot may still be running
            event.synchronize()
        table = _TABLES.get(self.table_id)
        if table is not None:
            table.free(self.worker, self.slot, self.owner)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # at interpreter exit the table may be gone already
            pass


def detached(batch: HostBatch) -> HostBatch:
    """``batch`` with its images copied out of a worker's slot and the slot freed; ``batch``
    itself when its images are its own."""
    if not isinstance(getattr(batch, "lease", None), SlotLease):
        return batch
    images = map_images(lambda t: alloc_batch(t.shape, pin=False).copy_(t), batch.images)
    own = dataclasses.replace(batch, images=images, lease=None)
    batch.release()
    return own


def _multi(shape: SampleShape) -> bool:
    return bool(shape) and isinstance(shape[0], tuple)


def _canonical(shape: Any) -> SampleShape:
    """``shape`` as plain ints: a tuple, or a tuple of tuples (one per view)."""
    if len(shape) and isinstance(shape[0], (tuple, list, torch.Size)):
        return tuple(tuple(int(s) for s in v) for v in shape)
    return tuple(int(s) for s in shape)
