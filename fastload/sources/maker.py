"""Batch request → HostBatch: the one batch builder every backend runs.

:class:`BatchMaker` plans a request (:mod:`fastload.sources.batchplan`), learns the sample
shape where it does not know it yet (the head of a batch, loaded beside it), leases the
batch's buffers from a pool (:mod:`fastload.sources.pools`), finishes every row in place
under the error policy (:class:`~fastload.sources.fetch.SampleLoader`) and collates the
targets. Every backend calls :meth:`BatchMaker.make`; they differ only in where it runs (a
worker process, the main process, a thread) and in the :class:`~fastload.sources.rowmap.RowMap`
that runs its per-row steps (in turn, or spread over the thread backend's decode threads).
"""

from __future__ import annotations

from typing import Any

import torch

from ..batch import HostBatch
from ..collate import collate_extras
from ..targets import TargetSpec, fill
from ..views import SampleShape, map_images, numpy_rows, row, shape_of
from .batchplan import BatchPlan, CpuExecutor, Row, cpu_executor, plan_row
from .fetch import Loaded, SampleLoader, put
from .inflight import InFlight
from .pools import BatchBuffers, BufferPool, Need
from .request import BatchRequest
from .rowmap import InTurn, RowMap, Tally
from .samples import Samples


class BatchMaker:
    """Makes HostBatches from batch requests: the one place a batch's rows are written.

    Args:
        loader: Loads rows with the error policy.
        executor: Plans and decodes the batch as a whole (or not): see :func:`~fastload.sources.batchplan.cpu_executor`.
    """

    def __init__(self, loader: SampleLoader, executor: CpuExecutor) -> None:
        self.loader, self.executor = loader, executor
        self._shape: SampleShape | None = None  # of one sample, learnt by head()
        self._shape_epoch: int | None = None
        self._copies = Tally()

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

    def new_pass(self) -> None:
        """The next head() learns the sample shape again (a transform may have changed)."""
        self._shape_epoch = None

    def shape(self, epoch: int) -> SampleShape | None:
        """The sample shape learnt for ``epoch`` in this process, or None."""
        return self._shape if self._shape_epoch == epoch else None

    def shaped(self, epoch: int) -> bool:
        """Whether the batches of ``epoch`` may be made at once here: the head of its first
        batch has fixed their sample shape."""
        return self.shape(epoch) is not None

    def head(self, plan: BatchPlan, worker: int = 0) -> list[Loaded]:
        """The first row(s) of a batch loaded beside it, all of the batch's sample shape; none
        when the shape of the epoch is known here already.

        The shape is learnt once per epoch and process, by majority: a first sample of an odd
        shape is then the error of that sample (raised, or replaced under "skip"), not of
        every other sample of the batch.

        Raises:
            ValueError: The first three samples have three different shapes.
        """
        request = plan.request
        if self.shape(request.epoch) is not None:
            return []
        seed, epoch = request.seed, request.epoch
        rows: list[Row] = []
        loaded: list[Loaded] = []
        for j in range(min(3, len(plan))):
            rows.append(plan.take(j))
            loaded.append(self.loader.load(rows[-1].key, epoch, worker, seed=seed, row=rows[-1]))
            shapes = [shape_of(item.image) for item in loaded]
            if max(shapes.count(s) for s in shapes) >= 2:
                break
        common = common_shape(loaded, self.loader)
        # A row not of the common shape is loaded again as a row of a known shape is (what any
        # other batch does with it): from its own sample, its replacements drawn for it and its
        # skipped samples reported. Not from ``item.index``, which may be a replacement already
        # (its sample failed, and the replacement is the odd one): that would draw other
        # replacements than another backend or worker count does, and drop the failed sample's
        # record. Its plan is spent (its generator has drawn); the error its planning met stays.
        head = [
            item
            if shape_of(item.image) == common
            else self.loader.load(r.key, epoch, worker, shape=common, seed=seed, row=Row(r.key, r.index, error=r.error))
            for r, item in zip(rows, loaded)
        ]
        self._shape, self._shape_epoch = common, request.epoch  # other batches of the epoch may start
        return head

    def make(self, request: BatchRequest, worker: int, pool: BufferPool, rows: RowMap | None = None) -> HostBatch:
        """Plans, loads and collates one batch into buffers leased from ``pool``.

        Args:
            request: The batch.
            worker: The worker making it (its pool's worker; its in-flight row where ``rows``
                runs in this thread).
            pool: Lends the batch's buffers.
            rows: Where its per-row steps run (default: in turn, in this thread).
        """
        rows = rows if rows is not None else InTurn(worker)
        loader = self.loader
        plan = BatchPlan.of(request)
        n = len(plan)
        if self.executor.plans:  # every row planned (read, checked, crop drawn), then the batch's regions decoded
            rows.map(lambda j, w: plan_row(loader, plan, j, w), range(n))
            rows.map(lambda _, w: self.executor.decode_batch(loader, plan, w), range(1))
        head = [] if self.shaped(request.epoch) else rows.map(lambda _, w: self.head(plan, w), range(1))[0]
        shape = self.shape(request.epoch)
        assert shape is not None  # fixed by this head, or by the epoch's first
        target = TargetSpec.of(head[0].label) if head else None
        buffers = pool.lease(Need(n, shape, target, worker, rows))
        try:
            images = numpy_rows(buffers.images)
            copies = sum(put(row(images, j), item, loader) for j, item in enumerate(head))

            def finish(j: int, w: int) -> tuple[Loaded, int]:
                r, into = plan.take(j), row(images, j)
                item = loader.load(r.key, request.epoch, w, into, seed=request.seed, row=r)
                return item, put(into, item, loader)

            done = rows.map(finish, range(len(head), n))
            self._copies.add(copies + sum(c for _, c in done))
            return collate(buffers, head + [item for item, _ in done], request.epoch, loader)
        except BaseException:
            pool.abandon(buffers, worker)  # never handed on: its buffer is free again once ``rows`` finished
            raise


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
