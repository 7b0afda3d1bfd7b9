"""Stream backend: DataLoader workers batch the records of their own slot of a stream.

Slot ``rank * num_workers + worker`` of ``world_size * num_workers`` reads its own
records (each record is read once per epoch over all ranks and workers), and every slot
yields the same number of records, so every rank yields the same number of batches. On
one rank, a stream with ``batch_slots = True`` is asked for whole batches instead
(``records_for(..., batch_size=...)``): every record once, as DataLoader batches them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from ..batch import HostBatch, SampleError, SkippedSample
from ..collate import batch_buffer, check_image
from ..datasets.protocols import ResumedSizes, traits_of
from ..datasets.stream_slots import batch_count, slot_batches_done
from ..views import numpy_rows, row, shape_of
from . import resume
from .failures import CLOSED
from .fetch import Loaded, collated, put
from .inflight import InFlight
from .process import WorkerOptions, dataloader_options, start_workers, worker_batches
from .request import PassRequest
from .resume import StreamResume


def whole_batches(stream: Any, world_size: int) -> bool:
    """Whether the stream's slots are runs of whole batches, unpadded: on one rank, where no
    other rank's batch count must be matched, when the stream can (``batch_slots = True``)."""
    return world_size == 1 and traits_of(stream).whole_batches


@dataclass(frozen=True)
class StreamOrder:
    """What a stream that orders its own passes (``shuffles`` / ``elastic``, e.g. WebDataset)
    is told with ``records_for(..., order=...)``; other streams are called without it.

    Attributes:
        epoch, seed: Draw the pass's order.
        shuffle: Whether to shuffle at all.
        batch_size: Turns the batch counts of ``history`` into records.
        history: The stages of this epoch run before (:class:`fastload.sources.resume.Stage`, with
            ``num_workers``), when the pass resumes it; the pass reads what they left.
    """

    epoch: int
    seed: int
    shuffle: bool
    batch_size: int
    history: tuple = ()


class _SlotBatches(torch.utils.data.IterableDataset):
    """One epoch of one rank: each worker batches its slot's records.

    A pass resumed after ``start`` batches of the rank leaves each slot's batches among
    them out, by record position (the records are read past, not decoded), and worker i
    reads slot (i + start) % workers: DataLoader asks worker 0 first, and the next batch
    is that slot's.
    """

    def __init__(
        self,
        stream: Any,
        epoch: int,
        seed: int,
        rank: int,
        world_size: int,
        batch_size: int,
        drop_last: bool,
        on_error: str,
        inflight: InFlight,
        start: int = 0,
        order: StreamOrder | None = None,
    ) -> None:
        super().__init__()
        self.stream, self.epoch, self.seed = stream, epoch, seed
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.drop_last, self.on_error, self.inflight = drop_last, on_error, inflight
        self.start, self.order = start, order
        self.layout = {"batch_size": batch_size} if whole_batches(stream, world_size) else {}

    def _load(self, record: Any, worker: int) -> Loaded:
        self.inflight.begin(worker, record.number, self.epoch)
        try:
            if record.error is not None:
                raise record.error
            return Loaded(self.stream.decode(record, self.epoch, self.seed), int(record.label), record.number, [])
        except Exception as e:
            if getattr(e, "sample_index", None) == record.number or self.on_error != "raise":
                raise
            raise SampleError(
                f"record {record.number} ({record.where}): {type(e).__name__}: {e}", record.number, record.where
            ) from e
        finally:
            self.inflight.end(worker)

    def _samples(self, worker: int, slot: int, slots: int, skip: int = 0) -> Iterator[Loaded]:
        """The slot's samples after its first ``skip`` records; under "skip" a failed record is
        replaced by a good neighbour, so the count (and the rank's batch count) stays the same."""
        last: Loaded | None = None
        owed: list[SkippedSample] = []
        ordered = {} if self.order is None else {"order": self.order}
        records = self.stream.records_for(slot, slots, drop_last=self.drop_last, **ordered, **self.layout)
        for record in itertools.islice(records, skip, None):
            try:
                item = self._load(record, worker)
            except Exception as e:
                if self.on_error == "raise":
                    raise
                skip = SkippedSample(self.epoch, record.number, record.where, f"{type(e).__name__}: {e}")
                if last is None:
                    owed.append(skip)
                    continue
                yield Loaded(last.image, last.label, last.index, [skip])
                continue
            for skip in owed:
                yield Loaded(item.image, item.label, item.index, [skip])
            owed, last = [], item
            yield item
        if owed:
            raise SampleError(
                f"on_error='skip': every record of stream slot {slot} failed; first: {owed[0]}",
                owed[0].index,
                owed[0].where,
            )

    def __iter__(self) -> Iterator[HostBatch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        local = (worker + self.start) % workers
        slot, slots = self.rank * workers + local, self.world_size * workers
        skip = slot_batches_done(self.start, local, workers) * self.batch_size
        items: list[Loaded] = []
        for item in self._samples(worker, slot, slots, skip):
            items.append(item)
            if len(items) == self.batch_size:
                yield self._collate(items)
                items = []
        if items and not self.drop_last:
            yield self._collate(items)

    def _collate(self, items: list[Loaded]) -> HostBatch:
        check_image(items[0].image, f"record {items[0].index}")
        images = batch_buffer(len(items), shape_of(items[0].image))
        rows = numpy_rows(images)
        for j, item in enumerate(items):
            put(row(rows, j), item, None)
        return collated(images, items, self.epoch)


class StreamSource:
    """HostBatches from a record stream (e.g. TFRecordStream), one DataLoader per epoch.

    Args:
        stream: Has ``slot_length``, ``records_for`` and ``decode`` (see TFRecordStream);
            with ``shuffles = True`` it can shuffle, with ``elastic = True`` resume on other
            ranks and workers (both take a :class:`StreamOrder`; ``resumed_sizes`` then
            gives ``len`` of such a pass), with ``batch_slots = True`` split whole batches
            on one rank (``records_for(..., batch_size=...)``).
        batch_size, drop_last, on_error, shuffle: As in LoaderConfig.
        rank, world_size: This rank among all.
        options: Worker count and settings (workers are started each epoch).
    """

    def __init__(
        self,
        stream: Any,
        *,
        batch_size: int,
        drop_last: bool,
        on_error: str,
        rank: int,
        world_size: int,
        options: WorkerOptions,
        shuffle: bool = False,
    ) -> None:
        self.stream, self.batch_size, self.drop_last, self.shuffle = stream, batch_size, drop_last, shuffle
        self.on_error, self.rank, self.world_size = on_error, rank, world_size
        self.options = dataclasses.replace(options, persistent=False)  # workers are started each epoch
        self.inflight = InFlight(max(1, options.num_workers))
        self._closed = False

    dataset = None  # records name themselves
    sampler = None

    @property
    def num_samples(self) -> int:
        return resume.dataset_size(self.stream)

    def __len__(self) -> int:
        if whole_batches(self.stream, self.world_size):
            return batch_count(self.num_samples, self.batch_size, self.drop_last)
        workers = max(1, self.options.num_workers)
        per_slot = self.stream.slot_length(self.world_size * workers, drop_last=self.drop_last)
        per_worker = per_slot // self.batch_size if self.drop_last else math.ceil(per_slot / self.batch_size)
        return workers * per_worker

    def reshard(self, rank: int, world_size: int, order_seed: int) -> None:
        """Reads this rank's slots of another world size from the next pass on."""
        self.rank, self.world_size = rank, world_size

    def resume_point(self, state: dict) -> StreamResume:
        plan = resume.stream_resume(
            state,
            self.rank,
            self.world_size,
            self.options.num_workers,
            len(self),
            elastic=traits_of(self.stream).elastic,
        )
        if not plan.history or not isinstance(self.stream, ResumedSizes):
            return plan
        # What the earlier stages left is re-dealt: this rank's batches are those of its slots.
        workers = max(1, self.options.num_workers)
        order = StreamOrder(plan.epoch, state["seed"], self.shuffle, self.batch_size, tuple(plan.history))
        layout = {"batch_size": self.batch_size} if whole_batches(self.stream, self.world_size) else {}
        sizes = self.stream.resumed_sizes(self.world_size * workers, drop_last=self.drop_last, order=order, **layout)
        mine = sizes[self.rank * workers : (self.rank + 1) * workers]
        return dataclasses.replace(
            plan, remaining=sum(batch_count(n, self.batch_size, self.drop_last) for n in mine) - plan.start
        )

    def state_fields(self) -> dict:
        return {"num_workers": self.options.num_workers}

    def restart(self) -> None:
        """Nothing to restart: every pass starts its own workers."""

    def batches(self, run: PassRequest) -> Iterator[HostBatch]:
        """One epoch's batches of this rank, from its batch number ``run.resumed.start`` on; after
        the stages ``run.resumed.history`` of the epoch, when it resumes one run on other ranks or workers."""
        if self._closed:
            raise RuntimeError(CLOSED)
        plan = run.resumed
        start, history = (0, ()) if plan is None else (plan.start, tuple(plan.history))
        epoch = run.epoch
        order = None
        if self.shuffle or history:
            order = StreamOrder(epoch, run.seed, self.shuffle, self.batch_size, history)
        data = _SlotBatches(
            self.stream,
            epoch,
            run.seed,
            self.rank,
            self.world_size,
            self.batch_size,
            self.drop_last,
            self.on_error,
            self.inflight,
            start,
            order,
        )
        loader = DataLoader(data, batch_size=None, **dataloader_options(self.options, self.options.persistent))
        yield from worker_batches(start_workers(loader, self.options), self.options, self.inflight, None)

    def close(self) -> None:
        self._closed = True
