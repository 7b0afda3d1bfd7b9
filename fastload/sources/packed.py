"""The worker side of ``decode="gpu"``: a batch plan packed for the device, bytes and geometry.

Each row is planned by the same machinery as every batch (:mod:`fastload.sources.batchplan`:
the same reads, the same draws from the same generator). Rows the GPU decoder takes
("encoded rows": a baseline JPEG, grey or colour, whole) travel as their JPEG bytes, end to
end in one buffer, with each row's geometry and flip (one of each per view for a multi-view
transform: the image is decoded once, each view cut from it; :mod:`fastload.sources.packing`
lays the batch out); the others (not a JPEG, CMYK, progressive, cut short, or failing to
plan) are built by the CPU path's batch builder in the worker
(:meth:`fastload.sources.maker.BatchMaker.build`, from their plans), under the error policy,
straight into a buffer of final pixels ("decoded rows"). Small per-row values are numpy
arrays, pickled with the batch; the two large buffers are leased from the source's pool, as a
CPU batch's pixels are (:mod:`fastload.sources.pools`; a worker process's reused buffers,
:mod:`fastload.sources.handoff`, copied out once on arrival), so nothing is left in
``/dev/shm`` by a batch never received. The device decodes the encoded rows
(:mod:`fastload.device.gpudecode`).

A request's ``cpu_share`` hands part of the GPU's work to the worker: the first
``round(cpu_share * R)`` of the R rows the GPU would take (in batch order) are loaded by the
CPU path too, exactly as ``decode="cpu"`` loads them (the same plan, the same draws), into
the decoded rows; the worker's time on them travels with the batch
(:attr:`EncodedBatch.cpu_seconds`), for the share's controller
(:class:`fastload.device.gpudecode.share.CpuShare`).

A stream's batch (:class:`~fastload.sources.slots.StreamMaker`: its records planned as read)
is packed the same way, and a record that fails under ``on_error="skip"`` takes its slot's
neighbour as with ``decode="cpu"`` (:mod:`fastload.sources.neighbours`): a good row before it
in its batch, whose pixels may be the device's, fills it there (its row is a hole,
:attr:`EncodedBatch.holes`); else the slot's last good record of an earlier batch, kept as it
was packed (:class:`~fastload.sources.neighbours.Kept`: a copy of its bytes and geometry, or
its pixels); else the first good row after it, on the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from ..batch import SkippedSample
from ..decode import ImageHeader
from ..decode.header import check_jpeg_complete
from ..encoded import EncodedBatch
from ..targets import Target, TargetSpec, as_target, fill
from ..views import map_images
from .batchplan import BatchPlan, cpu_executor, plan_row
from .fetch import SampleLoader
from .maker import BatchMaker
from .neighbours import Holes, Neighbours, Owed, from_slot
from .packing import EncodedRow, GpuRows, RowGeometry, holding, pack, pixels
from .pools import BatchBuffers, BufferPool
from .request import BatchRequest
from .rowmap import InTurn, RowMap


def gpu_decodable(header: ImageHeader) -> bool:
    """Whether the GPU decoder gets this image: a baseline JPEG, grey or colour.

    CMYK/YCCK, progressive JPEGs (which nvJPEG's GPU-only and hardware decoders refuse)
    and other formats are decoded on the CPU, in the worker.
    """
    return header.format == "jpeg" and header.components in (1, 3) and not header.progressive


def shared_rows(share: float, candidates: list[int]) -> list[int]:
    """The rows of ``candidates`` (the GPU-decodable rows, in batch order) that a request's
    ``cpu_share`` hands to the worker: the first ``round(share * len(candidates))``, halves
    rounded up."""
    k = int(np.floor(share * len(candidates) + 0.5))
    return candidates[: max(0, min(k, len(candidates)))]


class PackMaker:
    """Makes :class:`EncodedBatch` es from batch requests, in the workers (the GPU's executor).

    Args:
        loader: Plans rows and loads on the CPU those the GPU does not take, with the error policy.
        rows: The transforms as the device runs them.
    """

    def __init__(self, loader: SampleLoader, rows: GpuRows) -> None:
        self.loader, self.rows = loader, rows
        self.maker = BatchMaker(loader, cpu_executor(loader.samples))  # builds the rows the CPU decodes

    @property
    def copies(self) -> int:
        """Samples decoded beside their row and copied in (in this process)."""
        return self.maker.copies

    def _geometry(self, plan: BatchPlan, j: int) -> Sequence[RowGeometry] | None:
        """Row ``j``'s geometry on the GPU (one per view), or None when the CPU path must load
        it (its plan untouched)."""
        sample = plan.rows[j].plan
        if sample is None:
            return None
        try:
            if not gpu_decodable(sample.header):
                return None
            check_jpeg_complete(sample.data)  # a JPEG cut short is the CPU path's error to report
            return self.rows.plan(sample.steps)  # None without a crop: the device's transforms crop first
        except Exception:  # the CPU path meets it again and applies the error policy
            return None

    def _encoded(self, plan: BatchPlan, j: int, geometry: Sequence[RowGeometry]) -> tuple[EncodedRow, Target]:
        """Row ``j`` packed for the GPU: its flips drawn from its plan's generator (after its
        crops, as the CPU path draws them)."""
        r = plan.rows[j]
        sample = r.plan
        assert sample is not None
        header = sample.header
        flips = self.rows.draw_flips(sample.rng)
        name = self.loader.samples.name(r.key)
        row = EncodedRow(j, sample.data, header.height, header.width, geometry, flips, name, sample.verified)
        return row, as_target(sample.label)

    def new_pass(self) -> None:
        """The CPU rows' builder learns their shape again."""
        self.maker.new_pass()

    def shaped(self, epoch: int) -> bool:
        """Always: a batch's encoded rows need no shape, and its CPU rows' builder learns it alone."""
        return True

    @property
    def plans(self) -> bool:
        """Always: every row is planned (read, checked, its crop drawn) before it is packed."""
        return True

    def make(self, request: BatchRequest, worker: int, pool: BufferPool, rows: RowMap | None = None) -> EncodedBatch:
        """The EncodedBatch of an indexed dataset's ``request`` (see :meth:`build`)."""
        made = self.build(BatchPlan.of(request), worker, pool, rows)
        assert isinstance(made, EncodedBatch)  # an indexed dataset's failures are replaced, never owed
        return made

    def build(
        self,
        plan: BatchPlan,
        worker: int,
        pool: BufferPool,
        rows: RowMap | None = None,
        *,
        planned: bool = False,
        neighbours: Neighbours | None = None,
    ) -> EncodedBatch | Owed:
        """The EncodedBatch of ``plan``: bytes for the GPU, pixels for the rest (and for
        the request's ``cpu_share`` of what the GPU could take), the per-row steps run by
        ``rows`` (default: in turn, in this thread).

        Args:
            plan, worker, pool, rows, planned: As in :meth:`BatchMaker.build <fastload.sources.maker.BatchMaker.build>`.
            neighbours: A stream's slot: its failed records take their neighbours (see
                :func:`~fastload.sources.neighbours.from_slot`), and it keeps the batch's good records.

        Returns:
            The batch; :class:`Owed` for a stream's batch whose every record failed before
            its slot had a good one.
        """
        return holding(pool, worker, lambda held: self._build(plan, worker, pool, rows, planned, neighbours, held))

    def _build(
        self,
        plan: BatchPlan,
        worker: int,
        pool: BufferPool,
        rows: RowMap | None,
        planned: bool,
        neighbours: Neighbours | None,
        held: list[BatchBuffers],
    ) -> EncodedBatch | Owed:
        rows = rows if rows is not None else InTurn(worker)
        request = plan.request
        n = len(plan)
        if not planned:
            rows.map(lambda j, w: plan_row(self.loader, plan, j, w), range(n))
        geometry = [self._geometry(plan, j) for j in range(n)]
        # Decided before any flip is drawn: a shared row's generator is the CPU path's, untouched.
        shared = set(shared_rows(request.cpu_share, [j for j in range(n) if geometry[j] is not None]))
        packed = [
            self._encoded(plan, j, g) if g is not None and j not in shared else None for j, g in enumerate(geometry)
        ]
        cpu = [j for j in range(n) if packed[j] is None]
        targets: list[Target] = [0] * n
        indices = np.asarray([r.index for r in plan.rows], np.int64)
        skipped: tuple[SkippedSample, ...] = ()
        cpu_pixels = pixels(pool, 0, self.rows, worker)
        cpu_seconds = 0.0
        holes: list[int] = []
        if cpu:  # the CPU path's batch of these rows, from their plans, as decode="cpu" builds it
            seconds = [0.0] * len(cpu)
            left = Holes() if neighbours is not None else None
            host = self.maker.build(
                BatchPlan(request, [plan.rows[j] for j in cpu]),
                worker,
                pool,
                rows,
                planned=True,
                neighbours=left,
                row_seconds=seconds,
            )
            if isinstance(host, Owed):  # a stream's: every CPU row failed (before one fixed their shape)
                holes, skipped = list(cpu), tuple(host.skipped)
                cpu_pixels = pixels(pool, len(cpu), self.rows, worker)
                held.append(cpu_pixels)
                map_images(lambda t: t.zero_(), cpu_pixels.images)
                stand_in = next((entry[1] for entry in packed if entry is not None), 0)  # until they are filled
                for j in cpu:
                    targets[j] = stand_in
            else:
                cpu_pixels, skipped = BatchBuffers(host.images, lease=host.lease), host.skipped
                held.append(cpu_pixels)
                for k, j in enumerate(cpu):
                    targets[j], indices[j] = as_target(host.labels.numpy()[k]), int(host.indices[k])
                holes = [cpu[k] for k in left.rows] if left is not None else []
            cpu_seconds = sum(t for j, t in zip(cpu, seconds) if j in shared)
        encoded = []
        for j, entry in enumerate(packed):
            if entry is not None:
                encoded.append(entry[0])
                targets[j] = entry[1]
        if neighbours is not None:
            images = cpu_pixels.images
            slotted = from_slot(neighbours, request.seed, packed, encoded, cpu, holes, targets, indices, images)
            if slotted is None:
                return Owed(list(skipped))
            # Rows taken out leave a copy of the rest: it travels by value, its buffer goes back on arrival.
            cpu_pixels, holes = dataclasses.replace(cpu_pixels, images=slotted[0]), slotted[1]
        labels = TargetSpec.of(targets[0]).alloc(n)
        fill(labels, targets, lambda j: self.loader.samples.title_of(int(indices[j])))
        return pack(
            encoded,
            cpu,
            cpu_pixels,
            labels,
            torch.from_numpy(indices),
            request.epoch,
            tuple(skipped),
            self.rows.out_sizes,
            request.seed,
            len(shared),
            cpu_seconds,
            holes,
            pool=pool,
            worker=worker,
            held=held,
        )

    def owed(self, owed: Owed, slot: Neighbours, epoch: int, worker: int, pool: BufferPool) -> EncodedBatch:
        """The batch ``owed`` paid: each of its rows a copy of the ``slot``'s first good record
        (its packed row, or its pixels), reporting its own failure."""
        return holding(pool, worker, lambda held: self._owed(owed, slot, epoch, worker, pool, held))

    def _owed(
        self, owed: Owed, slot: Neighbours, epoch: int, worker: int, pool: BufferPool, held: list[BatchBuffers]
    ) -> EncodedBatch:
        first = slot.kept_first
        assert first is not None  # paid once the slot has read a good record
        n = len(owed.skipped)
        encoded: list[EncodedRow] = []
        if first.encoded is not None:
            encoded = [dataclasses.replace(first.encoded, row=j) for j in range(n)]
        rows = pixels(pool, 0 if encoded else n, self.rows, worker)
        held.append(rows)
        if not encoded:
            first.copy_into(rows.images, list(range(n)))
        labels = TargetSpec.of(first.label).alloc(n)
        fill(labels, [first.label] * n, lambda j: self.loader.samples.title_of(first.index))
        indices = torch.full((n,), first.index, dtype=torch.int64)
        cpu = [] if encoded else list(range(n))
        skipped = tuple(owed.skipped)
        return pack(
            encoded,
            cpu,
            rows,
            labels,
            indices,
            epoch,
            skipped,
            self.rows.out_sizes,
            first.seed,
            pool=pool,
            worker=worker,
            held=held,
        )
