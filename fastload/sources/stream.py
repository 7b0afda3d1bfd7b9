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
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from ..batch import HostBatch, SampleError, SkippedSample
from ..collate import check_image
from ..datasets.protocols import ResumedSizes, traits_of
from ..datasets.stream_slots import batch_count, slot_batches_done
from ..views import SampleShape, numpy_rows, row, shape_of
from . import resume
from .batchplan import BatchPlan, CpuExecutor, Row, cpu_executor, plan_row
from .closing import close_workers
from .failures import CLOSED, in_worker_iter
from .fetch import Loaded, SampleLoader, put
from .handoff import BufferTable, SharedPool, detached
from .inflight import InFlight
from .maker import collate, common_shape
from .pools import BufferPool, Need, PlainPool
from .process import ShowsDataset, WorkerOptions, dataloader_options, start_workers, worker_batches
from .request import BatchRequest, PassRequest
from .resume import StreamResume
from .samples import RecordSamples


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


class StreamMaker:
    """Makes one reading slot's batches from its records, with the batch machinery every source
    uses: a batch request of the slot's next records is planned (where the stream plans its
    records), its regions decoded in one call (:mod:`fastload.sources.batchplan`), each record
    finished under the error policy (:class:`~fastload.sources.fetch.SampleLoader`) and the
    batch collated into a buffer of ``pool`` (:func:`fastload.sources.maker.collate`).

    Under ``on_error="skip"`` a failed record is replaced by its slot's good neighbour (the
    last good record before it, else the first one after it), so a slot's count, and its
    rank's batch count, stays the same.

    Args:
        loader: Loads records with the error policy (its samples: the stream's records).
        executor: Plans and decodes a batch as a whole (or not).
        batch_size, drop_last: As in LoaderConfig.
        pool: Lends the batches' buffers.
    """

    def __init__(
        self, loader: SampleLoader, executor: CpuExecutor, batch_size: int, drop_last: bool, pool: BufferPool
    ) -> None:
        self.loader, self.executor, self.batch_size, self.drop_last = loader, executor, batch_size, drop_last
        self.pool = pool

    def _loaded(self, records: Iterator[Any], epoch: int, seed: int, rank: int, worker: int) -> Iterator[Any]:
        """Each record's sample, or (under "skip") the record of its failure, a batch at a time.

        A record is read as soon as it comes (planned, or loaded whole): a slot's reader may
        let go of its bytes once the slot's records are all read."""
        plan = BatchPlan(BatchRequest(epoch, np.zeros(0, np.int64), seed, rank))
        done: list[Loaded | Exception] = []
        number = 0
        shape: SampleShape | None = None  # of a sample, learnt from the slot's first batch as a maker learns it
        for record in itertools.chain(records, [None]):
            if record is not None:
                plan.rows.append(Row(record, int(record.number)))
                j = len(plan) - 1
                if self.executor.plans:
                    plan_row(self.loader, plan, j, worker)
                else:
                    done.append(self.loader.try_load(record, epoch, worker, seed=seed))
            if len(plan) == self.batch_size or (record is None and len(plan)):
                if self.executor.plans:
                    self.executor.decode_batch(self.loader, plan, worker)
                    for j in range(len(plan)):
                        r = plan.take(j)
                        done.append(self.loader.try_load(r.key, epoch, worker, seed=seed, row=r))
                good = [got for got in done if isinstance(got, Loaded)]
                if shape is None and good:
                    shape = common_shape(good, self.loader)
                for r, got in zip(plan.rows, done):
                    # A record not of the batch's shape is its own error (raised, or replaced by its neighbour).
                    got = self.loader.fitted(r.key, got, shape)
                    yield got if isinstance(got, Loaded) else self.loader.skipped(epoch, r.key, got)
                number += 1
                plan = BatchPlan(BatchRequest(epoch, np.zeros(0, np.int64), seed, rank, number))
                done = []

    def batches(
        self, records: Iterator[Any], epoch: int, seed: int, rank: int, slot: int, worker: int
    ) -> Iterator[HostBatch]:
        """The batches of slot ``slot``'s ``records`` (in worker ``worker``)."""
        last: Loaded | None = None
        owed: list[SkippedSample] = []
        ready: list[Loaded] = []
        for got in self._loaded(records, epoch, seed, rank, worker):
            if isinstance(got, SkippedSample):
                if last is None:
                    owed.append(got)
                else:
                    ready.append(dataclasses.replace(last, skipped=[got]))
            else:
                ready += [dataclasses.replace(got, skipped=[skip]) for skip in owed]
                owed, last = [], got
                ready.append(got)
            while len(ready) >= self.batch_size:
                yield self._collate(ready[: self.batch_size], epoch, worker)
                del ready[: self.batch_size]
        if owed:
            raise SampleError(
                f"on_error='skip': every record of stream slot {slot} failed; first: {owed[0]}",
                owed[0].index,
                owed[0].where,
            )
        if ready and not self.drop_last:
            yield self._collate(ready, epoch, worker)

    def _collate(self, items: list[Loaded], epoch: int, worker: int) -> HostBatch:
        """``items`` (decoded beside their rows) into one batch, of the first one's shape."""
        check_image(items[0].image, self.loader.samples.title_of(items[0].index))
        buffers = self.pool.lease(Need(len(items), shape_of(items[0].image), worker=worker))
        rows = numpy_rows(buffers.images)
        for j, item in enumerate(items):
            put(row(rows, j), item, self.loader)
        return collate(buffers, items, epoch, self.loader)


class SlotRecords(ShowsDataset, torch.utils.data.IterableDataset):
    """One epoch of one rank: each DataLoader worker batches its reading slot's records.

    A pass resumed after ``start`` batches of the rank leaves each slot's batches among
    them out, by record position (the records are read past, not decoded), and worker i
    reads slot (i + start) % workers: DataLoader asks worker 0 first, and the next batch
    is that slot's.
    """

    def __init__(
        self,
        maker: StreamMaker,
        epoch: int,
        seed: int,
        rank: int,
        world_size: int,
        start: int = 0,
        order: StreamOrder | None = None,
    ) -> None:
        super().__init__()
        self.maker, self.epoch, self.seed, self.rank, self.world_size = maker, epoch, seed, rank, world_size
        self.start, self.order = start, order
        self.stream = maker.loader.dataset
        self.layout = {"batch_size": maker.batch_size} if whole_batches(self.stream, world_size) else {}

    @property
    def inflight(self) -> InFlight:
        return self.maker.loader.inflight

    @property
    def shown(self) -> Any:
        """The stream (``get_worker_info().dataset`` in a worker)."""
        return self.stream

    def __iter__(self) -> Iterator[HostBatch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        local = (worker + self.start) % workers
        into, slots = self.rank * workers + local, self.world_size * workers
        skip = slot_batches_done(self.start, local, workers) * self.maker.batch_size
        ordered = {} if self.order is None else {"order": self.order}
        records = self.stream.records_for(into, slots, drop_last=self.maker.drop_last, **ordered, **self.layout)
        batches = self.maker.batches(
            itertools.islice(records, skip, None), self.epoch, self.seed, self.rank, into, worker
        )
        return in_worker_iter(batches, info.id if info is not None else None)


class StreamSource:
    """HostBatches from a record stream (e.g. TFRecordStream), one DataLoader per epoch.

    Args:
        stream: A :class:`~fastload.datasets.protocols.RecordStream` (``slot_length``,
            ``records_for``, ``decode``; see TFRecordStream) whose
            :class:`~fastload.datasets.protocols.StreamTraits` say what else it does: it
            shuffles, it resumes on other ranks and workers (both take a
            :class:`StreamOrder`; ``resumed_sizes`` then gives ``len`` of such a pass), it
            splits whole batches on one rank (``records_for(..., batch_size=...)``).
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
        samples = RecordSamples(stream)
        loader = SampleLoader(samples, on_error, self.inflight)
        # Workers collate into buffers of their own that the main process maps (as an indexed
        # source's do): torch's shared memory would leave a named /dev/shm segment behind for
        # every batch still in flight when a pass is broken off or its workers end.
        pool: BufferPool = PlainPool(options.pin, options.pin_device)  # with no workers, pinned as the Loader says
        if options.num_workers > 0 and BufferTable.supported:
            pool = SharedPool(BufferTable(options.num_workers, options.prefetch_factor + 2))
        self.maker = StreamMaker(loader, cpu_executor(samples), batch_size, drop_last, pool)
        self._closed = threading.Event()  # seen by a pass running in another thread

    dataset = None  # records name themselves
    sampler = None

    @property
    def loader(self) -> SampleLoader:
        return self.maker.loader

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
        if self._closed.is_set():
            raise RuntimeError(CLOSED)
        plan = run.resumed
        start, history = (0, ()) if plan is None else (plan.start, tuple(plan.history))
        epoch = run.epoch
        order = None
        if self.shuffle or history:
            order = StreamOrder(epoch, run.seed, self.shuffle, self.batch_size, history)
        if isinstance(self.maker.pool, SharedPool):
            self.maker.pool.renew()  # each pass starts its own workers: fresh buffers for them
        data = SlotRecords(self.maker, epoch, run.seed, self.rank, self.world_size, start, order)
        loader = DataLoader(data, batch_size=None, **dataloader_options(self.options, self.options.persistent))
        # Out of the worker's buffer at once (the pin-memory thread has copied a pinned batch).
        for batch in worker_batches(
            start_workers(loader, self.options), self.options, self.inflight, None, self._closed
        ):
            yield cast(HostBatch, detached(batch))  # a stream makes no EncodedBatch

    def close(self) -> None:
        """Ends the pass under way (from any thread: its ``next()`` raises the closed error)
        and stops its workers, killing those not gone after a grace (:mod:`.closing`)."""
        if self._closed.is_set():
            return
        close_workers(self._closed, self.inflight, [])  # the pass holds the DataLoader: nothing of ours to drop
        if isinstance(self.maker.pool, SharedPool):
            self.maker.pool.close()
