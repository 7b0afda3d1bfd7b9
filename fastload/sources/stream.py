"""Stream backend: DataLoader workers (on the thread backend, threads) batch their own
slot's records (:mod:`.slots`); worker processes persist across passes, each pass posted to
them on a :class:`~.board.PassBoard`."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from ..config import DEVICE_AHEAD
from ..datasets.protocols import ResumedSizes, traits_of
from ..datasets.stream_slots import batch_count
from ..encoded import SourceBatch
from . import resume
from .batchplan import cpu_executor
from .board import PassBoard
from .failures import PassClosed, WorkerFailure
from .fetch import SampleLoader
from .handoff import BufferTable, SharedPool, detached, worker_buffers
from .inflight import InFlight
from .maker import BatchMaker
from .packed import GpuRows, PackMaker
from .pools import BufferPool, PlainPool
from .request import PassRequest
from .resume import StreamResume
from .ring import RingPool
from .samples import RecordSamples
from .segments import SUPPORTED
from .slot_threads import slot_threads
from .slots import SlotMaker, SlotPass, SlotRecords, StreamMaker, StreamOrder, whole_batches
from .waiting import JOIN_S, join_within
from .worker_loader import WorkerLoader, worker_batches
from .workers import WorkerOptions, dataloader_options


class StreamSource:
    """Batches from a record stream (e.g. TFRecordStream), from one DataLoader across passes
    (threads: :func:`slot_threads`): HostBatches, or with ``decode="gpu"`` EncodedBatches.

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
            read as each pass starts (and posted with it to persistent workers).
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
        self._ring: RingPool | None = None  # the pool of a pass on threads, made anew after a timeout
        if options.num_workers > 0 and BufferTable.supported and not self.threads:
            per_worker = worker_buffers(options.prefetch_factor, gpu is not None)
            pool = SharedPool(BufferTable(options.num_workers, per_worker))
        elif gpu is None and self.threads and reuse:
            # Sized as each pass starts (reset: _in_use), and allocated at its first batch.
            pool = self._ring = self._new_ring()
        maker: SlotMaker = PackMaker(loader, gpu) if gpu is not None else BatchMaker(loader, cpu_executor(samples))
        self.maker = StreamMaker(maker, batch_size, drop_last, pool)
        self.records = SlotRecords(self.maker, PassBoard() if persistent else None)
        board = self.records.board
        self._slots: list[threading.Thread] = []  # the slot threads of the passes on threads
        self.workers = WorkerLoader(
            lambda: DataLoader(self.records, batch_size=None, **dataloader_options(self.options, persistent)),
            self.options,
            self.inflight,
            self._closed,
            renew=lambda: self.maker.pool.reset(self._in_use()),
            stop=board.stop if board is not None else lambda: None,
            watched=self.stream,
        )

    def _new_ring(self) -> RingPool:
        # Sized as each pass starts (reset: _in_use), and allocated at its first batch.
        return RingPool(DEVICE_AHEAD + 1, self.batch_size, self.options.pin, self.options.pin_device, self._closed)

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
                try:
                    self.records.board.post(slots)
                except OSError:
                    if self._closed.is_set():  # close() from another thread let go of the board
                        raise PassClosed() from None
                    raise
            self.maker.maker.new_pass()  # without workers, this process's maker learns the shape again

        if self.threads:
            self.maker.pool.reset(self._in_use())  # each pass starts its own threads
            prepare()
            o = self.options
            try:
                yield from slot_threads(
                    self.records, o.num_workers, o.prefetch_factor, o.timeout, self.inflight, self._closed, self._slots
                )
            except WorkerFailure:  # past the timeout: a slot thread stuck in a record keeps its buffer
                if self._ring is not None:  # the next pass lends from a new ring (one left each time ran dry)
                    self._ring = self.maker.pool = self._new_ring()
                raise
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
        # None goes on calling the transform after close() returned (a program that then exits
        # would tear down what those calls use): each finishes the batch it makes, then ends.
        join_within(self._slots, JOIN_S)
        self._slots.clear()
        self.maker.pool.close()
        if self.records.board is not None:
            self.records.board.close()
