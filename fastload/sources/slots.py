"""A stream's reading slots: which records each reads in a pass (:class:`SlotPass`), and
how its records become batches (:class:`StreamMaker`), in a worker process or a thread
(:class:`SlotRecords`).

Slot ``rank * num_workers + worker`` of ``world_size * num_workers`` reads its own
records (each record is read once per epoch over all ranks and workers), and every slot
yields the same number of records, so every rank yields the same number of batches. On
one rank, a stream with ``batch_slots = True`` is asked for whole batches instead
(``records_for(..., batch_size=...)``): every record once, as DataLoader batches them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..batch import SampleError
from ..datasets.protocols import traits_of
from ..datasets.stream_slots import slot_batches_done
from ..encoded import SourceBatch
from .batchplan import BatchPlan, Row, plan_row
from .board import PassBoard
from .failures import in_worker_iter
from .fetch import SampleLoader
from .inflight import InFlight
from .neighbours import Neighbours, Owed
from .pools import BufferPool
from .request import BatchRequest
from .workers import ShowsDataset


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
        return self._posted(info.id, info.num_workers)

    def _to_the_end(self, batches: Iterator[SourceBatch], worker: int) -> Iterator[SourceBatch]:
        yield from batches
        # DataLoader ends a worker whose slot is read while the others read on: its exit is
        # not a death (the pass would fail, naming it, a tick later).
        self.inflight.finished(worker)

    def _posted(self, worker: int, workers: int) -> Iterator[SourceBatch]:
        """A persistent worker's slot in the pass posted on the board, until the main process
        gives it up (:meth:`PassBoard.stop`), looked at before each batch is made: the drain of a
        pass cut short waits for the batches under way, not for the rest of the slot (under
        ``on_error="skip"`` a batch may take the batches owed before it along).

        All of it runs as the first batch is asked for, not in ``iter()``: DataLoader resumes a
        persistent worker's pass with no guard around ``iter()``, so an error there (the stream
        refusing ``records_for``) would end the worker instead of reaching the main process."""
        board = self.board
        assert board is not None
        generation, self.run = board.read()  # this copy of the records learns the pass
        self.maker.maker.new_pass()  # and its maker the shape, anew
        batches = in_worker_iter(self._slot_lazily(worker, workers), worker)
        try:
            while board.generation == generation:
                batch = next(batches, None)
                if batch is None:
                    return
                yield batch
        finally:
            batches.close()  # the slot's reader lets go of its shard now, not when collected

    def _slot_lazily(self, worker: int, workers: int) -> Iterator[SourceBatch]:
        yield from self.slot(worker, workers)  # its errors arise in in_worker_iter's loop

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
