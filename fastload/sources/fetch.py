"""Batch request → HostBatch: the one place samples are loaded, named, replaced and collated.

Every backend goes through :class:`BatchFetcher`, so error policy, error messages,
in-flight tracking and the collate into a batch buffer are the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..batch import HostBatch, SampleError, SkippedSample
from ..collate import batch_buffer, check_image, write_row
from ..datasets.base import accepts_out, plannable, sample_name, sample_rng
from ..datasets.protocols import name_of
from ..targets import Target, TargetSpec, as_target, fill
from ..views import SampleShape, batch_shape, map_images, numpy_rows, row, shape_of
from .batched import Prepared, prepare
from .handoff import SlotTable
from .inflight import InFlight
from .sampler import BatchRequest

MAX_REPLACEMENTS = 10


def describe(dataset: Any, index: int) -> str:
    """The dataset's name for sample ``index`` (path, key or record), else "sample N"."""
    return name_of(dataset, index)


def name_error(dataset: Any, index: int, error: Exception) -> Exception:
    """``error`` if it already names sample ``index``, else a SampleError that does."""
    if getattr(error, "sample_index", None) == index:
        return error
    where = describe(dataset, index)
    named = SampleError(f"{sample_name(index, where)}: {type(error).__name__}: {error}", index, where)
    named.__cause__ = error
    return named


@dataclass
class Loaded:
    """One sample as loaded into (or beside) its batch slot."""

    image: np.ndarray | tuple[np.ndarray, ...]  # a tuple: one array per view (a multi-view transform)
    label: Target  # int (the fast path), float or numeric array: see fastload.targets
    index: int  # the sample actually loaded (differs from the request after a replacement)
    skipped: list[SkippedSample]


class BatchFetcher(torch.utils.data.Dataset):
    """Loads samples with the error policy and collates them into one uint8 batch.

    Also the torch Dataset handed to DataLoader workers: its ``__getitems__`` turns a
    BatchRequest into a HostBatch in the worker.

    Args:
        dataset: Anything with ``__len__`` and ``load(index, epoch, seed, out=None)``.
        seed: Base seed for augmentation randomness.
        on_error: "raise" (the error names the sample) or "skip" (replace the sample by
            a deterministic random other one, reported with the batch).
        inflight: Table the loading worker marks (for the watchdog and worker deaths).
        slots: Batch buffers each worker process reuses (see :mod:`.handoff`); None: a new
            buffer per batch.
    """

    def __init__(
        self, dataset: Any, seed: int, on_error: str, inflight: InFlight, slots: SlotTable | None = None
    ) -> None:
        self.dataset, self.seed, self.on_error, self.inflight = dataset, seed, on_error, inflight
        self.slots = slots
        self._writes_in_place = accepts_out(dataset.load)
        self._shape: SampleShape | None = None  # of one sample, learnt by head()
        self._shape_epoch: int | None = None
        # A dataset that plans has each batch planned first, its regions decoded in one
        # call; _load_one then finishes those samples (fastload/sources/batched.py).
        self._plans = plannable(dataset)
        self._prepared: dict[tuple[int, int], Prepared] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def _load_one(
        self,
        index: int,
        epoch: int,
        seed: int,
        worker: int,
        out: np.ndarray | tuple | None,
        shape: SampleShape | None = None,
    ) -> tuple[np.ndarray | tuple, Target]:
        self.inflight.begin(worker, index, epoch)
        try:
            prepared = self._prepared.pop((index, epoch), None)
            if prepared is not None:
                image, target = self.dataset.finish(prepared.plan, prepared.pixels, out), prepared.plan.label
            elif out is None or not self._writes_in_place:
                image, target = self.dataset.load(index, epoch, seed)
            else:
                image, target = self.dataset.load(index, epoch, seed, out=out)
        finally:
            self.inflight.end(worker)
        # A bad image is an error of its sample, so the error policy applies to it too.
        check_image(image, "the image")
        shape = shape_of(out) if out is not None else shape
        if shape is not None and shape_of(image) != shape:
            raise ValueError(
                f"image has shape {shape_of(image)} but the batch holds {tuple(shape)}; use a transform "
                "with a fixed output size (e.g. RandomResizedCrop or CenterCrop)"
            )
        return image, as_target(target)  # a TypeError here is named as the sample's error

    def load(
        self,
        index: int,
        epoch: int,
        worker: int = 0,
        out: np.ndarray | tuple | None = None,
        shape: SampleShape | None = None,
        seed: int | None = None,
    ) -> Loaded:
        """Sample ``index`` (or its replacement), written into ``out`` where the transforms allow;
        an image not of ``out``'s shape (or ``shape``) is an error of its sample. ``seed``: of the
        draws (default: the fetcher's)."""
        seed = self.seed if seed is None else seed
        try:
            image, label = self._load_one(index, epoch, seed, worker, out, shape)
            return Loaded(image, label, index, [])
        except Exception as e:
            if self.on_error == "raise":
                raise name_error(self.dataset, index, e) from e
            error: Exception = e
        skipped = [self._skipped(epoch, index, error)]
        failed = {index}
        rng = sample_rng(seed, epoch, index)
        n = len(self.dataset)
        for _ in range(MAX_REPLACEMENTS):
            other = int(rng.integers(n))
            while other in failed and len(failed) < n:
                other = int(rng.integers(n))
            try:
                image, label = self._load_one(other, epoch, seed, worker, out, shape)
                return Loaded(image, label, other, skipped)
            except Exception as e:
                skipped.append(self._skipped(epoch, other, e))
                failed.add(other)
                error = e
        raise SampleError(
            f"on_error='skip': sample {index} and {MAX_REPLACEMENTS} replacements failed; last: {skipped[-1]}",
            index,
            skipped[0].where,
        ) from error

    def _skipped(self, epoch: int, index: int, error: Exception) -> SkippedSample:
        # An error that already names its sample (DecodeError from the dataset) is reported
        # by its cause, so the record does not say the name twice.
        named = getattr(error, "sample_index", None) == index and error.__cause__ is not None
        shown = error.__cause__ if named else error
        return SkippedSample(epoch, index, describe(self.dataset, index), f"{type(error).__name__}: {shown}")

    def new_pass(self) -> None:
        """The next head() learns the sample shape again (a transform may have changed)."""
        self._shape_epoch = None

    def head(self, request: BatchRequest, worker: int = 0) -> list[Loaded]:
        """The first sample(s) of a batch, loaded beside it, all of the batch's sample shape.

        The shape is learnt once per epoch and process, by majority: a first sample of an odd
        shape is then the error of that sample (raised, or replaced under "skip"), not of
        every other sample of the batch.

        Raises:
            ValueError: The first three samples have three different shapes.
        """
        indices, epoch, seed = request.indices, request.epoch, request.seed
        if self._shape_epoch == epoch:
            return [self.load(int(indices[0]), epoch, worker, shape=self._shape, seed=seed)]
        loaded: list[Loaded] = []
        for index in indices[:3]:
            loaded.append(self.load(int(index), epoch, worker, seed=seed))
            shapes = [shape_of(item.image) for item in loaded]
            common = max(set(shapes), key=shapes.count)
            if shapes.count(common) >= 2:
                break
        else:
            if len(loaded) == 3:
                named = ", ".join(
                    f"sample {i.index} ({describe(self.dataset, i.index)}) {shape_of(i.image)}" for i in loaded
                )
                raise ValueError(
                    f"the first samples of a batch differ in shape: {named}; use a transform with a "
                    "fixed output size (e.g. RandomResizedCrop or CenterCrop)"
                )
            common = shape_of(loaded[0].image)
        self._shape, self._shape_epoch = common, epoch
        return [
            item if shape_of(item.image) == common else self.load(item.index, epoch, worker, shape=common, seed=seed)
            for item in loaded
        ]

    def fetch(self, request: BatchRequest, worker: int = 0, pin: bool | None = None) -> HostBatch:
        """Loads and collates one batch: the head fixes the shape, the rest are written
        straight into their rows."""
        indices = request.indices
        if self._plans:
            self._prepared = prepare(self, request, worker)
        loaded = self.head(request, worker)
        sample = shape_of(loaded[0].image)
        if self.slots is None or get_worker_info() is None:
            return self._fill(request, loaded, batch_buffer(len(indices), sample, pin=pin), worker)
        images, lease = self.slots.buffer(worker, batch_shape(len(indices), sample))
        try:
            batch = self._fill(request, loaded, images, worker)
        except BaseException:
            if lease is not None:  # never sent: the slot is free again
                self.slots.free(worker, lease.slot, lease.owner)
            raise
        batch.lease = lease
        return batch

    def _fill(
        self, request: BatchRequest, loaded: list[Loaded], images: torch.Tensor | tuple, worker: int
    ) -> HostBatch:
        """The batch of ``request`` in ``images``: the ``loaded`` head copied in, the rest loaded
        straight into their rows."""
        indices, rows = request.indices, numpy_rows(images)
        for j, item in enumerate(loaded):
            put(row(rows, j), item, self.dataset)
        for j in range(len(loaded), len(indices)):
            slot = row(rows, j)
            item = self.load(int(indices[j]), request.epoch, worker, slot, seed=request.seed)
            put(slot, item, self.dataset)
            loaded.append(item)
        return collated(images, loaded, request.epoch, dataset=self.dataset)

    def __getitems__(self, request: BatchRequest) -> HostBatch:
        info = get_worker_info()
        return self.fetch(request, info.id if info is not None else 0)

    def __getitem__(self, index: int) -> tuple[np.ndarray | tuple, Target]:
        item = self.load(int(index), 0, seed=0)
        return item.image, item.label


def put(slot: np.ndarray | tuple, item: Loaded, dataset: Any) -> int:
    """Writes ``item`` into its batch row (see :func:`fastload.collate.write_row`)."""
    if item.image is slot:
        return 0
    return write_row(slot, item.image, sample_name(item.index, describe(dataset, item.index)))


def collated(
    images: torch.Tensor | tuple,
    loaded: list[Loaded],
    epoch: int,
    labels: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    dataset: Any = None,
) -> HostBatch:
    """The HostBatch of ``loaded`` samples whose pixels are already in ``images``; targets
    go into ``labels`` (else a new tensor shaped by the first sample's target)."""
    n = len(loaded)
    labels = TargetSpec.of(loaded[0].label).alloc(n) if labels is None else labels[:n]
    indices = torch.empty(n, dtype=torch.int64) if indices is None else indices[:n]
    fill(
        labels,
        [item.label for item in loaded],
        lambda j: sample_name(loaded[j].index, describe(dataset, loaded[j].index)),
    )
    indices.numpy()[:] = [item.index for item in loaded]
    skipped = tuple(s for item in loaded for s in item.skipped)
    return HostBatch(map_images(lambda t: t[:n], images), labels, indices, epoch, skipped)
