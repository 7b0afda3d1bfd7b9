"""Batch request → HostBatch: the one batch builder every backend runs.

:class:`BatchMaker` plans a request (:mod:`fastload.sources.batchplan`), learns the sample
shape where it does not know it yet (the head of a batch, loaded beside it), leases the
batch's buffers from a pool (:mod:`fastload.sources.pools`), finishes every row in place
under the error policy (:class:`~fastload.sources.fetch.SampleLoader`) and collates the
targets. Process workers and the main process call :meth:`BatchMaker.make`; the thread
backend runs the same steps with the rows spread over its threads.
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
from .pools import BatchBuffers, BufferPool, Need, Writers
from .request import BatchRequest
from .samples import Samples


class BatchMaker:
    """Makes HostBatches from batch requests.

    Args:
        loader: Loads rows with the error policy.
        executor: Plans and decodes the batch as a whole (or not): see :func:`~fastload.sources.batchplan.cpu_executor`.
    """

    def __init__(self, loader: SampleLoader, executor: CpuExecutor) -> None:
        self.loader, self.executor = loader, executor
        self._shape: SampleShape | None = None  # of one sample, learnt by head()
        self._shape_epoch: int | None = None

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

    def plan(self, request: BatchRequest, worker: int = 0, *, ahead: bool = True) -> BatchPlan:
        """The plan of ``request``: with ``ahead``, its rows planned and decoded as the executor
        does it (else the caller plans them, :meth:`plan_row`, and calls :meth:`decode_batch`)."""
        plan = BatchPlan.of(request)
        if ahead and self.executor.plans:
            for j in range(len(plan)):
                plan_row(self.loader, plan, j, worker)
            self.decode_batch(plan, worker)
        return plan

    def plan_row(self, plan: BatchPlan, j: int, worker: int = 0) -> None:
        plan_row(self.loader, plan, j, worker)

    def decode_batch(self, plan: BatchPlan, worker: int = 0) -> None:
        self.executor.decode_batch(self.loader, plan, worker)

    def load_row(
        self, plan: BatchPlan, j: int, worker: int = 0, out: Any = None, shape: SampleShape | None = None
    ) -> Loaded:
        """Row ``j`` (or its replacement) into ``out`` (else beside), under the error policy."""
        r, request = plan.take(j), plan.request
        return self.loader.load(r.key, request.epoch, worker, out, shape, seed=request.seed, row=r)

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
        self._shape, self._shape_epoch = common, request.epoch
        # A row not of the common shape is loaded again as a row of a known shape is (what any
        # other batch does with it): from its own sample, its replacements drawn for it and its
        # skipped samples reported. Not from ``item.index``, which may be a replacement already
        # (its sample failed, and the replacement is the odd one): that would draw other
        # replacements than another backend or worker count does, and drop the failed sample's
        # record. Its plan is spent (its generator has drawn); the error its planning met stays.
        return [
            item
            if shape_of(item.image) == common
            else self.loader.load(r.key, epoch, worker, shape=common, seed=seed, row=Row(r.key, r.index, error=r.error))
            for r, item in zip(rows, loaded)
        ]

    def lease(
        self, plan: BatchPlan, head: list[Loaded], pool: BufferPool, worker: int = 0, until: Writers | None = None
    ) -> BatchBuffers:
        """The batch's buffers from ``pool``: of the epoch's sample shape, targets of the head's spec."""
        target = TargetSpec.of(head[0].label) if head else None
        shape = self.shape(plan.request.epoch)
        if shape is None:
            raise RuntimeError("lease() before the head of the epoch fixed the sample shape")
        return pool.lease(Need(len(plan), shape, target, worker, until))

    def make(self, request: BatchRequest, worker: int, pool: BufferPool) -> HostBatch:
        """Plans, loads and collates one batch into buffers leased from ``pool``."""
        plan = self.plan(request, worker)
        head = self.head(plan, worker)
        buffers = self.lease(plan, head, pool, worker)
        try:
            rows = numpy_rows(buffers.images)
            loaded = []
            for j, item in enumerate(head):
                put(row(rows, j), item, self.loader)
                loaded.append(item)
            for j in range(len(head), len(plan)):
                into = row(rows, j)
                item = self.load_row(plan, j, worker, into)
                put(into, item, self.loader)
                loaded.append(item)
            return self.collate(buffers, loaded, request)
        except BaseException:
            pool.abandon(buffers, worker)  # never handed on: its buffer is free again
            raise

    def collate(self, buffers: BatchBuffers, loaded: list[Loaded], request: BatchRequest) -> HostBatch:
        """The HostBatch of ``loaded`` samples whose pixels are already in ``buffers``; the targets
        go into its room for them where their spec is the first sample's, else into a new tensor."""
        return collate(buffers, loaded, request.epoch, self.loader)


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
