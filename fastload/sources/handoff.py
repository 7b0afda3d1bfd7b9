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
never make a worker wait: with none free, it allocates a new buffer as before.
"""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
import weakref
from typing import Any

import torch

from ..batch import HostBatch
from ..collate import alloc_batch
from ..views import Images, SampleShape, map_images, shapes

FREE = 0  # a busy slot holds the pid of the worker process that lent it
_REUSED, _NEW = -2, -1  # counter columns after the flags: batches in a reused slot, in a new buffer

#: The tables of this process, by id: a lease that arrives from a worker finds its table here.
_TABLES: weakref.WeakValueDictionary[str, SlotTable] = weakref.WeakValueDictionary()


class SlotTable:
    """A row of slot flags per worker, in shared memory made before the workers start.

    Args:
        workers: Worker processes.
        slots: Buffers each worker may keep (enough for the batches it can have in flight).
    """

    def __init__(self, workers: int, slots: int) -> None:
        if workers < 1 or slots < 1:
            raise ValueError(f"workers and slots must be >= 1, got {workers} and {slots}")
        table = torch.zeros((workers, slots + 2), dtype=torch.int64)
        table.share_memory_()  # before any numpy view: see fastload/storage.py
        self._setup(uuid.uuid4().hex, table)

    def renewed(self) -> SlotTable:
        """A table of the same size with every slot free, for a new generation of workers (slots
        the old one lost with a killed worker or an unread batch are not carried over)."""
        workers, columns = self._rows.shape
        return SlotTable(workers, columns - 2)

    def _setup(self, table_id: str, table: torch.Tensor) -> None:
        self.id, self._table, self._rows = table_id, table, table.numpy()
        self._buffers: dict[int, torch.UntypedStorage] = {}  # this worker's slots, by number
        _TABLES[table_id] = self

    def __getstate__(self) -> tuple[str, torch.Tensor]:
        return self.id, self._table

    def __setstate__(self, state: tuple[str, torch.Tensor]) -> None:
        self._setup(*state)

    @property
    def counts(self) -> tuple[int, int]:
        """(batches built in a reused slot, batches built in a new buffer), all workers."""
        return int(self._rows[:, _REUSED].sum()), int(self._rows[:, _NEW].sum())

    def buffer(self, worker: int, shape: SampleShape) -> tuple[Images, SlotLease | None]:
        """A uint8 tensor of ``shape`` for worker ``worker``'s next batch: a free slot of its
        own (with the lease that frees it), else new shared memory (no lease). A tuple of
        shapes (a multi-view batch) gives a tuple of tensors, one after another in one slot."""
        row = self._rows[worker]
        per_view, multi = shapes(shape), isinstance(shape[0], tuple)
        nbytes = sum(math.prod(int(s) for s in v) for v in per_view)
        for k in range(row.size - 2):
            if row[k] != FREE:
                continue
            storage = self._buffers.get(k)
            if storage is None or storage.nbytes() < nbytes:
                storage = self._buffers[k] = torch.UntypedStorage._new_shared(nbytes)
            else:
                row[_REUSED] += 1
            row[k] = os.getpid()
            views, offset = [], 0
            for v in per_view:
                views.append(torch.empty(0, dtype=torch.uint8).set_(storage, offset, tuple(int(s) for s in v)))
                offset += math.prod(int(s) for s in v)
            images = tuple(views) if multi else views[0]
            return images, SlotLease(self.id, worker, k, os.getpid())
        row[_NEW] += 1
        return (tuple(alloc_batch(v) for v in per_view) if multi else alloc_batch(shape)), None

    def free(self, worker: int, slot: int, owner: int) -> None:
        """Frees the slot if process ``owner`` still holds it: a late release of a batch of a
        dead worker must not free the slot its successor (same worker number) has lent since."""
        if self._rows[worker, slot] == owner:
            self._rows[worker, slot] = FREE


class SlotLease:
    """Worker ``worker``'s slot ``slot`` of table ``table_id``, lent with one batch by process ``owner``.

    Only the copy that arrives in the main process frees the slot: on :meth:`release`,
    or when it is collected unreleased (its batch was dropped unread).
    """

    travels = True  # a HostBatch may carry this lease to another process

    def __init__(self, table_id: str, worker: int, slot: int, owner: int, received: bool = False) -> None:
        self.table_id, self.worker, self.slot, self.owner = table_id, worker, slot, int(owner)
        self._open = received

    def __reduce__(self) -> tuple[Any, tuple[str, int, int, int, bool]]:
        return SlotLease, (self.table_id, self.worker, self.slot, self.owner, True)

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
