"""Stream backend: DataLoader workers (on the thread backend, threads) batch their own slot's records.

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
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from ..batch import SampleError
from ..config import DEVICE_AHEAD
from ..datasets.protocols import ResumedSizes, traits_of
from ..datasets.stream_slots import batch_count, slot_batches_done
from ..encoded import SourceBatch
from . import resume
from .batchplan import BatchPlan, Row, cpu_executor, plan_row
from .board import PassBoard
from .failures import PassClosed, WorkerFailure, in_worker_iter
from .fetch import SampleLoader
from .handoff import BufferTable, SharedPool, detached, worker_buffers
from .inflight import InFlight
from .maker import BatchMaker
from .neighbours import Neighbours, Owed
from .packed import GpuRows, PackMaker
from .pools import BufferPool, PlainPool
from .request import BatchRequest, PassRequest
from .resume import StreamResume
from .ring import RingPool
from .samples import RecordSamples
from .segments import SUPPORTED
from .slot_threads import slot_threads
from .worker_loader import WorkerLoader, worker_batches
from .workers import ShowsDataset, WorkerOptions, dataloader_options


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


class SlotMaker(Protocol):
    """What builds a stream's batches from their plans: the CPU path's
    :class:`~fastload.sources.maker.BatchMaker` (a HostBatch), or the GPU's
    :class:`~fastload.sources.packed.PackMaker` (an EncodedBatch for the device)."""

    loader: SampleLoader

    @property
    def plans(self) -> bool:
        """Whether each record is planned as it is read."""

    def build(
        self,
        plan: BatchPlan,
        worker: int,
        pool: BufferPool,
        rows: Any = None,
        *,
        planned: bool = False,
        neighbours: Neighbours | None = None,
    ) -> SourceBatch | Owed:
        """The batch of ``plan`` (see :meth:`fastload.sources.maker.BatchMaker.build`)."""

    def owed(self, owed: Owed, slot: Neighbours, epoch: int, worker: int, pool: BufferPool) -> SourceBatch:
        """The batch ``owed`` paid with the ``slot``'s first good record."""

    def new_pass(self) -> None:
        """The next batch learns its sample shape again."""


@dataclass(frozen=True)
class SlotPass:
    """What one pass of a rank's slots reads: its epoch and ``seed``, this rank of
    ``world_size``, the batches of the rank ``start`` leaves out (a resumed pass), the
    stream's ``order`` (:class:`StreamOrder`, or None) and ``decode="gpu"``'s ``cpu_share``."""

    epoch: int
    seed: int
    rank: int
    world_size: int
    start: int = 0
    order: StreamOrder | None = None
    cpu_share: float = 0.0


class StreamMaker:
    """Makes one reading slot's batches from its records, with the batch builder every source
    uses (:meth:`fastload.sources.maker.BatchMaker.build`; with ``decode="gpu"``, the GPU's
    packing, :meth:`fastload.sources.packed.PackMaker.build`): each record is planned as soon as
    it is read (where the stream plans its records: a slot's reader may let go of a shard's
    bytes once its records are read), ``batch_size`` of them make a batch plan, and the builder
    decodes its regions and finishes its rows in place in a buffer of ``pool``.

    Under ``on_error="skip"`` a failed record is replaced by its slot's good neighbour (the
    last good record before it, else the first one after it: :mod:`fastload.sources.neighbours`),
    so a slot's count, and its rank's batch count, stays the same.

    Args:
        maker: Builds the batches (its loader's samples: the stream's records).
        batch_size, drop_last: As in LoaderConfig.
        pool: Lends the batches' buffers.
    """

    def __init__(self, maker: SlotMaker, batch_size: int, drop_last: bool, pool: BufferPool) -> None:
        self.maker, self.batch_size, self.drop_last, self.pool = maker, batch_size, drop_last, pool

    @property
    def loader(self) -> SampleLoader:
        return self.maker.loader

    def _plans(self, records: Iterator[Any], run: SlotPass, worker: int) -> Iterator[BatchPlan]:
        """The slot's records cut into batch plans, each record planned as it is read."""
        plans, share, epoch, seed, rank = self.maker.plans, run.cpu_share, run.epoch, run.seed, run.rank
        plan = BatchPlan(BatchRequest(epoch, np.zeros(0, np.int64), seed, rank, cpu_share=share))
        for record in records:
            plan.rows.append(Row(record, int(record.number)))
            if plans:
                plan_row(self.loader, plan, len(plan) - 1, worker)
            if len(plan) == self.batch_size:
                yield plan
                number = plan.request.number + 1
                plan = BatchPlan(BatchRequest(epoch, np.zeros(0, np.int64), seed, rank, number, share))
        if len(plan) and not self.drop_last:
            yield plan

    def batches(self, records: Iterator[Any], run: SlotPass, slot: int, worker: int) -> Iterator[SourceBatch]:
        """The batches of slot ``slot``'s ``records`` in the pass ``run`` (in worker ``worker``)."""
        neighbours, epoch = Neighbours(), run.epoch
        owed: list[Owed] = []
        for plan in self._plans(records, run, worker):
            made = self.maker.build(plan, worker, self.pool, planned=True, neighbours=neighbours)
            if isinstance(made, Owed):
                owed.append(made)
                continue
            for batch in owed:  # the slot's first good record stands in for every record before it
                yield self.maker.owed(batch, neighbours, epoch, worker, self.pool)
            owed = []
            yield made
        if owed:
            first = owed[0].skipped[0]
            raise SampleError(
                f"on_error='skip': every record of stream slot {slot} failed; first: {first}", first.index, first.where
            )


class SlotRecords(ShowsDataset, torch.utils.data.IterableDataset):
    """The passes of one rank: each DataLoader worker (or thread) batches its reading slot's
    records of the pass :attr:`run`, which the main process sets before each pass.

    A pass resumed after ``start`` batches of the rank leaves each slot's batches among
    them out, by record position (the records are read past, not decoded), and worker i
    reads slot (i + start) % workers: DataLoader asks worker 0 first, and the next batch
    is that slot's.

    Args:
        maker: Batches a slot's records.
        board: Where workers that persist across passes read each pass (None: workers
            start with each pass, or there are none, and read :attr:`run` as it was set).
    """

    def __init__(self, maker: StreamMaker, board: PassBoard | None = None) -> None:
        super().__init__()
        self.maker, self.board = maker, board
        self.stream = maker.loader.dataset
        self.run = SlotPass(0, 0, 0, 1)
        self._generation = 0  # of the board's pass this worker reads

    @property
    def inflight(self) -> InFlight:
        return self.maker.loader.inflight

    @property
    def shown(self) -> Any:
        """The stream (``get_worker_info().dataset`` in a worker)."""
        return self.stream

    def __iter__(self) -> Iterator[SourceBatch]:
        info = get_worker_info()
        if info is None:
            return in_worker_iter(self.slot(0, 1), None)
        if self.board is None:
            return self._to_the_end(in_worker_iter(self.slot(info.id, info.num_workers), info.id), info.id)
        # A persistent worker: this copy of the records learns the pass, and its maker the shape, anew.
        self._generation, self.run = self.board.read()
        self.maker.maker.new_pass()
        return self._until_given_up(in_worker_iter(self.slot(info.id, info.num_workers), info.id))

    def _to_the_end(self, batches: Iterator[SourceBatch], worker: int) -> Iterator[SourceBatch]:
        yield from batches
        # DataLoader ends a worker whose slot is read while the others read on: its exit is
        # not a death (the pass would fail, naming it, a tick later).
        self.inflight.finished(worker)

    def _until_given_up(self, batches: Generator[SourceBatch, None, None]) -> Iterator[SourceBatch]:
        """``batches``, until the main process gives the pass up (:meth:`PassBoard.stop`):
        looked at before each batch is made, so the drain of a pass cut short waits for no
        more than the batches under way."""
        board, generation = self.board, self._generation
        assert board is not None
        try:
            while board.generation == generation:
                batch = next(batches, None)
                if batch is None:
                    return
                yield batch
        finally:
            batches.close()  # the slot's reader lets go of its shard now, not when collected

    def slot(self, worker: int, workers: int) -> Iterator[SourceBatch]:
        """The batches of worker ``worker`` of ``workers`` (a process, or a thread) in the pass :attr:`run`."""
        run = self.run
        local = (worker + run.start) % workers
        into, slots = run.rank * workers + local, run.world_size * workers
        skip = slot_batches_done(run.start, local, workers) * self.maker.batch_size
        ordered = {} if run.order is None else {"order": run.order}
        layout = {"batch_size": self.maker.batch_size} if whole_batches(self.stream, run.world_size) else {}
        records = self.stream.records_for(into, slots, drop_last=self.maker.drop_last, **ordered, **layout)
        return self.maker.batches(itertools.islice(records, skip, None), run, into, worker)


class StreamSource:
    """Batches from a record stream (e.g. TFRecordStream), one DataLoader per epoch (threads: :func:`slot_threads`):
    HostBatches, or with ``decode="gpu"`` EncodedBatches.

    Args:
        stream: A :class:`~fastload.datasets.protocols.RecordStream` (``slot_length``,
            ``records_for``, ``decode``; see TFRecordStream) whose
            :class:`~fastload.datasets.protocols.StreamTraits` say what else it does: it
            shuffles, it resumes on other ranks and workers (both take a
            :class:`StreamOrder`; ``resumed_sizes`` then gives ``len`` of such a pass), it
            splits whole batches on one rank (``records_for(..., batch_size=...)``).
        batch_size, drop_last, on_error, shuffle: As in LoaderConfig.
        rank, world_size: This rank among all.
        options: Worker count and settings (persistent workers read each pass from a PassBoard).
        threads: Read each slot in a thread of this process (the thread backend), not in a worker process.
        reuse: With ``threads``: reuse the batches' buffers (a ring; off when the consumer keeps
            views of the uint8 batch).
        gpu: ``decode="gpu"``: the transforms as the device runs them; the slots then pack
            batches for it (:class:`~fastload.sources.packed.PackMaker`).
        cpu_share: With ``gpu``: the share of GPU-decodable rows the slots decode on the CPU,
            read as each pass starts (its workers, or threads, start with it).
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
        threads: bool = False,
        reuse: bool = True,
        gpu: GpuRows | None = None,
        cpu_share: Callable[[], float] | None = None,
    ) -> None:
        self.stream, self.batch_size, self.drop_last, self.shuffle = stream, batch_size, drop_last, shuffle
        self.on_error, self.rank, self.world_size = on_error, rank, world_size
        self.threads = threads and options.num_workers > 0
        # Persistent workers read each pass from a board (memfd): where there is none, new workers each pass.
        persistent = options.persistent and options.num_workers > 0 and not self.threads and SUPPORTED
        self.options = dataclasses.replace(options, persistent=persistent)
        # GPU decode: a row for this process too, where the device loads the rows its decoder refuses.
        self.inflight = InFlight(max(1, options.num_workers) + (gpu is not None))
        self.cpu_share = cpu_share
        self._closed = threading.Event()  # seen by a pass running in another thread
        samples = RecordSamples(stream)
        loader = SampleLoader(samples, on_error, self.inflight)
        # Workers collate into buffers of their own that the main process maps (as an indexed
        # source's do): torch's shared memory would leave a named /dev/shm segment behind for
        # every batch still in flight when a pass is broken off or its workers end.
        # With no workers, pinned as the Loader says; GPU batches on threads are packed bytes: a new buffer each.
        pool: BufferPool = PlainPool(options.pin and gpu is None, options.pin_device)
        if options.num_workers > 0 and BufferTable.supported and not self.threads:
            per_worker = worker_buffers(options.prefetch_factor, gpu is not None)
            pool = SharedPool(BufferTable(options.num_workers, per_worker))
        elif gpu is None and self.threads and reuse:
            # Sized as each pass starts (reset: _in_use), and allocated at its first batch.
            pool = RingPool(DEVICE_AHEAD + 1, batch_size, options.pin, options.pin_device, self._closed)
        maker: SlotMaker = PackMaker(loader, gpu) if gpu is not None else BatchMaker(loader, cpu_executor(samples))
        self.maker = StreamMaker(maker, batch_size, drop_last, pool)
        self.records = SlotRecords(self.maker, PassBoard() if persistent else None)
        board = self.records.board
        self.workers = WorkerLoader(
            lambda: DataLoader(self.records, batch_size=None, **dataloader_options(self.options, persistent)),
            self.options,
            self.inflight,
            self._closed,
            renew=lambda: self.maker.pool.reset(self._in_use()),
            stop=board.stop if board is not None else lambda: None,
        )

    def _in_use(self) -> int:
        """The buffers a pass on threads has in use at once: each thread's ``prefetch_factor``
        batches made and the one it makes (no more than the epoch has, and a huge prefetch_factor
        allocates no more), the device stage's ``DEVICE_AHEAD`` and the consumer's."""
        workers, prefetch = self.options.num_workers, self.options.prefetch_factor
        return min(workers * (prefetch + 1), len(self) + workers) + DEVICE_AHEAD + 1

    dataset = None  # records name themselves
    sampler = None
    replays = False  # records are read once, in order: a pass cannot be made again from a batch

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
        """New workers for the next pass, after a worker failed (threads: nothing to restart)."""
        if not self.threads:
            self.workers.restart()

    def batches(self, run: PassRequest) -> Iterator[SourceBatch]:
        """One epoch's batches of this rank, from its batch number ``run.resumed.start`` on; after
        the stages ``run.resumed.history`` of the epoch, when it resumes one run on other ranks or workers."""
        if self._closed.is_set():
            raise PassClosed()
        plan = run.resumed
        start, history = (0, ()) if plan is None else (plan.start, tuple(plan.history))
        order = None
        if self.shuffle or history:
            order = StreamOrder(run.epoch, run.seed, self.shuffle, self.batch_size, history)
        share = self.cpu_share() if self.cpu_share is not None else 0.0
        slots = SlotPass(run.epoch, run.seed, self.rank, self.world_size, start, order, share)

        def prepare() -> None:
            self.records.run = slots
            if self.records.board is not None:
                self.records.board.post(slots)
            self.maker.maker.new_pass()  # without workers, this process's maker learns the shape again

        if self.threads:
            self.maker.pool.reset(self._in_use())  # each pass starts its own threads
            prepare()
            o = self.options
            yield from slot_threads(
                self.records, o.num_workers, o.prefetch_factor, o.timeout, self.inflight, self._closed
            )
            return
        try:
            items = worker_batches(self.workers.start(prepare), self.options, self.inflight, None, self._closed)
            # Out of the worker's buffer at once (the pin-memory thread has copied a pinned batch).
            for batch in items:
                yield detached(batch)
        except WorkerFailure:
            self.restart()
            raise

    def close(self) -> None:
        """Ends the pass under way (from any thread: its ``next()`` raises the closed error)
        and stops its workers (or threads), killing workers not gone after a grace (:mod:`.closing`)."""
        if self._closed.is_set():
            return
        self.workers.close()
        self.maker.pool.close()
        if self.records.board is not None:
            self.records.board.close()
