"""Batch request → HostBatch: the one batch builder every backend runs.

:class:`BatchMaker` plans a request (:mod:`fastload.sources.batchplan`), learns the sample
shape where it does not know it yet (the head of a batch, loaded beside it), leases the
batch's buffers from a pool (:mod:`fastload.sources.pools`), finishes every row in place
under the error policy (:class:`~fastload.sources.fetch.SampleLoader`) and collates the
targets. Every host batch is built by :meth:`BatchMaker.build`: through :meth:`BatchMaker.make`
for an indexed dataset's request, through :class:`~fastload.sources.slots.StreamMaker` for a
stream's records, through :class:`~fastload.sources.packed.PackMaker` for the rows of a GPU
pack decoded on the CPU, and for the rows the device's decoder refuses. Where it runs (a worker
process, the main process, a thread), the pool that lends its buffers and the
:class:`~fastload.sources.rowmap.RowMap` that runs its per-row steps (in turn, or spread over
the thread backend's decode threads) are the caller's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, cast

import torch

from ..batch import HostBatch
from ..collate import collate_extras
from ..targets import TargetSpec, fill
from ..views import SampleShape, map_images, numpy_rows, row, shape_of
from .batchplan import BatchPlan, CpuExecutor, Row, cpu_executor, plan_row
from .fetch import Failed, Loaded, SampleLoader, put
from .inflight import InFlight
from .neighbours import Neighbours, Owed, Replaces
from .pools import BatchBuffers, BufferPool, Need
from .request import BatchRequest
from .rowmap import Building, InTurn, RowMap, Tally
from .samples import Samples


class BatchMaker:
    """Makes HostBatches from batch requests: the one place a batch's rows are written.

    Args:
        loader: Loads rows with the error policy.
        executor: Plans and decodes the batch as a whole (or not): see :func:`~fastload.sources.batchplan.cpu_executor`.
    """

    def __init__(self, loader: SampleLoader, executor: CpuExecutor) -> None:
        self.loader, self.executor = loader, executor
        self._learnt: tuple[int, SampleShape] | None = None  # (epoch, shape of one sample), by head()
        self._copies = Tally()
        # Threads making batches of one epoch at once (the thread runner's slots) each learn
        # its shape from their own head, loaded without a lock (a sample that hangs holds up
        # its own batch only); the first shape learnt stands, and a head that learnt another
        # is fitted to it.
        self._learning = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_learning"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._learning = threading.Lock()

    @property
    def copies(self) -> int:
        """Samples decoded beside their row and copied in (in this process)."""
        return self._copies.value

    @classmethod
    def of(cls, dataset: Any, on_error: str = "raise", inflight: InFlight | None = None) -> BatchMaker:
        """The maker of ``dataset``'s batches, its executor chosen as the sources choose it."""
        loader = SampleLoader(Samples(dataset), on_error, inflight or InFlight(1))
        return cls(loader, cpu_executor(loader.samples))

    @property
    def inflight(self) -> Any:
        return self.loader.inflight

    @property
    def plans(self) -> bool:
        """Whether its batches' rows are planned first (a stream plans them as they are read)."""
        return self.executor.plans

    def new_pass(self) -> None:
        """The next head() learns the sample shape again (a transform may have changed)."""
        self._learnt = None

    def shape(self, epoch: int) -> SampleShape | None:
        """The sample shape learnt for ``epoch`` in this process, or None."""
        learnt = self._learnt  # one read: another thread may set it meanwhile
        return learnt[1] if learnt is not None and learnt[0] == epoch else None

    def shaped(self, epoch: int) -> bool:
        """Whether the batches of ``epoch`` may be made at once here: the head of its first
        batch has fixed their sample shape."""
        return self.shape(epoch) is not None

    def head(self, plan: BatchPlan, worker: int = 0) -> tuple[list[Loaded | Failed], SampleShape | None]:
        """The first row(s) of a batch loaded beside it, all of the batch's sample shape, and
        that shape: no rows when the shape of the epoch is known here already; every row,
        failed, and no shape when every row failed (a stream's records under "skip").

        The shape is learnt once per epoch and process, by majority: a first sample of an odd
        shape is then the error of that sample (raised, or replaced under "skip"), not of
        every other sample of the batch. Threads learning at once each load their own head;
        the first shape learnt stands, and the others' rows of another shape are loaded again
        against it.

        Raises:
            ValueError: The first three samples have three different shapes.
        """
        epoch = plan.request.epoch
        if (known := self.shape(epoch)) is not None:
            return [], known
        rows, loaded, common = self._learn(plan, worker)
        if common is None:
            return loaded, None
        with self._learning:
            if (known := self.shape(epoch)) is None:
                self._learnt = (epoch, common)  # other batches of the epoch may start
        return self._fit(rows, loaded, known or common, plan, worker), known or common

    def _learn(self, plan: BatchPlan, worker: int) -> tuple[list[Row], list[Loaded | Failed], SampleShape | None]:
        """The head's rows, as loaded, and the shape they vote for (None: all failed)."""
        request = plan.request
        seed, epoch = request.seed, request.epoch
        rows: list[Row] = []
        loaded: list[Loaded | Failed] = []
        good: list[Loaded] = []
        for j in range(len(plan)):  # up to 3 good ones (an indexed dataset's are: failures are replaced)
            rows.append(plan.take(j))
            loaded.append(self.loader.row(rows[-1].key, epoch, worker, seed=seed, row=rows[-1]))
            if isinstance(loaded[-1], Loaded):
                good.append(loaded[-1])
                shapes = [shape_of(item.image) for item in good]
                if max(shapes.count(s) for s in shapes) >= 2 or len(good) == 3:
                    break
        if not good:
            return rows, loaded, None
        common = common_shape(good, self.loader)
        shapes = [shape_of(item.image) for item in good]
        if len(good) < 3 and shapes.count(common) < 2 and self.loader.samples.replaces:
            # A batch of one or two with no majority: the shapes of the samples after its first
            # decide, so an odd first sample is its own error, not every other sample's.
            beside = self.loader.shapes_beside(rows[0].key, epoch, worker, seed, 3 - len(good))
            votes = shapes + beside
            common = max(votes, key=lambda s: (votes.count(s), -votes.index(s)))
        return rows, loaded, common

    def _fit(
        self, rows: list[Row], loaded: list[Loaded | Failed], shape: SampleShape, plan: BatchPlan, worker: int
    ) -> list[Loaded | Failed]:
        """The head's rows, each of ``shape``: a row of another is loaded again as a row of a
        known shape is (what any other batch does with it): from its own sample, its
        replacements drawn for it and its skipped samples reported. Not from ``item.index``,
        which may be a replacement already (its sample failed, and the replacement is the odd
        one): that would draw other replacements than another backend or worker count does,
        and drop the failed sample's record. Its plan is spent (its generator has drawn); the
        error its planning met stays."""
        request = plan.request
        return [
            item
            if isinstance(item, Failed) or shape_of(item.image) == shape
            else self.loader.row(
                r.key, request.epoch, worker, shape=shape, seed=request.seed, row=Row(r.key, r.index, error=r.error)
            )
            for r, item in zip(rows, loaded)
        ]

    def make(self, request: BatchRequest, worker: int, pool: BufferPool, rows: RowMap | None = None) -> HostBatch:
        """Plans, loads and collates one batch of an indexed dataset into buffers leased from ``pool``.

        Args:
            request: The batch.
            worker: The worker making it (its pool's worker; its in-flight row where ``rows``
                runs in this thread).
            pool: Lends the batch's buffers.
            rows: Where its per-row steps run (default: in turn, in this thread).
        """
        batch = self.build(BatchPlan.of(request), worker, pool, rows)
        assert isinstance(batch, HostBatch)  # an indexed dataset's failures are replaced, never owed
        return batch

    def build(
        self,
        plan: BatchPlan,
        worker: int,
        pool: BufferPool,
        rows: RowMap | None = None,
        *,
        planned: bool = False,
        neighbours: Replaces | None = None,
        row_seconds: list[float] | None = None,
    ) -> HostBatch | Owed:
        """The batch of ``plan``: its rows planned (unless ``planned`` already, as a stream plans its
        records as they are read), its regions decoded, its head fixing the sample shape, then
        every row finished in place in a buffer leased from ``pool`` and the targets collated.

        Args:
            plan: The batch's rows.
            worker, pool, rows: As in :meth:`make`.
            planned: Its rows were planned already (in the order they were read).
            neighbours: A stream's slot: fills the rows of records that failed under "skip"
                (:class:`~fastload.sources.neighbours.Neighbours`; ``decode="gpu"``: leaves them
                to the device, :class:`~fastload.sources.neighbours.Holes`).
            row_seconds: Where each row's time to finish is written (the GPU's share controller
                reads the CPU's time per row; a head row, loaded to fix the shape, counts 0).

        Returns:
            The batch; for a stream's batch whose records all failed before its slot had a
            good one, what it owes (its rows become the slot's first good record, later).
        """
        rows = rows if rows is not None else InTurn(worker)
        loader, request = self.loader, plan.request
        n = len(plan)
        if self.executor.plans:  # every row planned (read, checked, crop drawn), then the batch's regions decoded
            if not planned:
                rows.map(lambda j, w: plan_row(loader, plan, j, w), range(n))
            rows.map(lambda _, w: self.executor.decode_batch(loader, plan, w), range(1))
        head: list[Loaded | Failed] = []
        if (shape := self.shape(request.epoch)) is None:
            head, shape = rows.map(lambda _, w: self.head(plan, w), range(1))[0]
        if shape is None:  # every row failed (loaded by the head) before any fixed the shape
            return Owed([cast(Failed, item).skipped for item in head])
        first = next((item for item in head if isinstance(item, Loaded)), None)
        target = TargetSpec.of(first.label) if first is not None else None
        building = Building(rows)  # the buffer is lent again only once this build and its rows are done
        buffers = pool.lease(Need(n, shape, target, worker, building))
        try:
            images = numpy_rows(buffers.images)
            copies = sum(put(row(images, j), item, loader) for j, item in enumerate(head) if isinstance(item, Loaded))

            def finish(j: int, w: int) -> tuple[Loaded | Failed, int]:
                start = time.perf_counter()
                r, into = plan.take(j), row(images, j)
                item = loader.row(r.key, request.epoch, w, into, seed=request.seed, row=r)
                copies = put(into, item, loader) if isinstance(item, Loaded) else 0
                if row_seconds is not None:
                    row_seconds[j] = time.perf_counter() - start
                return item, copies

            done = rows.map(finish, range(len(head), n))
            self._copies.add(copies + sum(c for _, c in done))
            items = head + [item for item, _ in done]
            if neighbours is not None:  # a stream's failed record becomes its slot's neighbour
                chosen = neighbours.choose(items)
                if chosen is None:
                    pool.abandon(buffers, worker)
                    return Owed([cast(Failed, item).skipped for item in items])
                good = [item for item in items if isinstance(item, Loaded)]
                for j, k in chosen:
                    source = cast(Loaded, items[k]) if k is not None else neighbours.last
                    assert source is not None
                    pixels = row(images, k) if k is not None else source.image
                    put(row(images, j), dataclasses.replace(source, image=pixels), loader)
                    skipped = [cast(Failed, items[j]).skipped]
                    items[j] = dataclasses.replace(source, image=row(images, j), skipped=skipped)
                neighbours.remember(good)
            return collate(buffers, cast(list[Loaded], items), request.epoch, loader)
        except BaseException:
            pool.abandon(buffers, worker)  # never handed on: its buffer is free again once ``rows`` finished
            raise
        finally:
            building.done = True

    def owed(self, owed: Owed, slot: Neighbours, epoch: int, worker: int, pool: BufferPool) -> HostBatch:
        """The batch ``owed`` paid: each of its rows the ``slot``'s first good record, reporting its own failure."""
        first = slot.first
        assert first is not None  # paid once the slot has read a good record
        n = len(owed.skipped)
        building = Building(InTurn(worker))
        buffers = pool.lease(Need(n, shape_of(first.image), TargetSpec.of(first.label), worker, building))
        try:
            images = numpy_rows(buffers.images)
            items = []
            for j, skipped in enumerate(owed.skipped):
                put(row(images, j), first, self.loader)
                items.append(dataclasses.replace(first, image=row(images, j), skipped=[skipped]))
            return collate(buffers, items, epoch, self.loader)
        except BaseException:
            pool.abandon(buffers, worker)
            raise
        finally:
            building.done = True


def common_shape(loaded: list[Loaded], loader: SampleLoader) -> SampleShape:
    """The sample shape of a batch, learnt from its first samples (up to three) by majority:
    a first sample of an odd shape is then the error of that sample, not of every other one.

    Raises:
        ValueError: The first three samples have three different shapes.
    """
    shapes = [shape_of(item.image) for item in loaded[:3]]
    for shape in shapes:
        if shapes.count(shape) >= 2:
            return shape
    if len(shapes) == 3:
        named = ", ".join(f"{loader.samples.title_of(i.index)} {shape_of(i.image)}" for i in loaded[:3])
        raise ValueError(
            f"the first samples of a batch differ in shape: {named}; use a transform with a "
            "fixed output size (e.g. RandomResizedCrop or CenterCrop)"
        )
    return shapes[0]


def collate(buffers: BatchBuffers, loaded: list[Loaded], epoch: int, loader: SampleLoader) -> HostBatch:
    """The HostBatch of ``loaded`` samples (of ``epoch``) whose pixels are in ``buffers``: the
    targets typed by the first sample's (see :mod:`fastload.targets`), the indices after replacements."""
    n = len(loaded)
    spec = TargetSpec.of(loaded[0].label)
    labels = buffers.labels[:n] if buffers.labels is not None and buffers.target == spec else spec.alloc(n)
    indices = buffers.indices[:n] if buffers.indices is not None else torch.empty(n, dtype=torch.int64)
    fill(labels, [item.label for item in loaded], lambda j: loader.samples.title_of(loaded[j].index))
    indices.numpy()[:] = [item.index for item in loaded]
    skipped = tuple(s for item in loaded for s in item.skipped)
    extras = collate_extras([item.extras for item in loaded])
    return HostBatch(
        map_images(lambda t: t[:n], buffers.images), labels, indices, epoch, skipped, buffers.lease, extras
    )
