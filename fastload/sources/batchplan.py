"""A batch request as a batch plan, and the CPU executors that decode one.

A :class:`BatchPlan` holds a row per sample of a request: for a dataset that plans
(:class:`~fastload.datasets.protocols.Plans`), its :class:`~fastload.datasets.sampleplan.SamplePlan`
(bytes read, header checked, crop drawn, decode chosen) and, where its region was decoded
with the batch's, those pixels; for any other dataset (a user's own), just the index it
loads. The :class:`~fastload.sources.fetch.SampleLoader` then finishes each row into its
batch row under the error policy.

How the plan is decoded is the executor's (:func:`cpu_executor` chooses, once):

- :class:`PerSample`: for a dataset that does not plan (a user's own): each row is loaded
  whole, nothing planned ahead.
- :class:`BatchedRegions`: every row is planned first, and the regions of the rows planned
  for a region decode (only samples whose bytes were verified strictly before, or every
  sample with the deprecated ``FASTLOAD_ROI=trusted``: :mod:`fastload.decode.plan`) are
  decoded in one nvImageCodec call
  (:meth:`RegionDecoder.decode_batch <fastload.decode.roi.RegionDecoder.decode_batch>`);
  finishing a row then does the rest (the other decodes, resize, flip).

Plans, draws, pixels, errors, replacements and their order are those of the per-sample
path, sample for sample: a row whose planning fails raises that error when it is loaded,
where the policy applies (its bytes are read once, as on the per-sample path); a region
the batched call could not decode, or one of a JPEG cut short (whose region above the cut
would decode), is decoded alone when its row is finished, where it fails as on the
per-sample path. (The GPU's worker side, :mod:`fastload.sources.packed`, plans rows the
same way and packs them instead.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from ..datasets.sampleplan import SamplePlan
from ..decode import DecodeError, roi
from ..decode.header import check_jpeg_complete
from .fetch import SampleLoader
from .request import BatchRequest
from .samples import RecordSamples, Samples

#: Fewer region plans than this in a batch are decoded one by one (nothing to share).
MIN_BATCH = 2


@dataclass
class Row:
    """One row of a batch plan: the sample it loads and how far it was prepared."""

    key: Any  # what names the sample to its dataset: an index, or a stream's record
    index: int  # the sample's number (its index, or its record's): names it, seeds its draws
    plan: SamplePlan | None = None  # None: loaded whole (not planned), or failed
    pixels: np.ndarray | None = None  # its planned region, decoded with the batch's
    error: Exception | None = None  # what its planning raised: loading it raises this


@dataclass
class BatchPlan:
    """The rows of one batch request."""

    request: BatchRequest
    rows: list[Row] = field(default_factory=list)

    @classmethod
    def of(cls, request: BatchRequest) -> BatchPlan:
        """The plan of an indexed dataset's request: a row per index (a stream's plan gets its
        rows as its records are read, :class:`~fastload.sources.slots.StreamMaker`)."""
        return cls(request, [Row(int(i), int(i)) for i in request.indices])

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, j: int) -> Row:
        """Row ``j``, its plan handed out once (a plan's generator draws as it is finished)."""
        row = self.rows[j]
        self.rows[j] = Row(row.key, row.index)
        return row


def plan_row(loader: SampleLoader, plan: BatchPlan, j: int, worker: int) -> None:
    """Plans row ``j``; a row whose planning fails keeps its error, which loading it raises."""
    row, request = plan.rows[j], plan.request
    mark = loader.inflight.begin(worker, row.index, request.epoch, loader.samples.in_flight(row.key))
    try:
        row.plan = loader.samples.plan(row.key, request.epoch, request.seed)
    except Exception as e:  # the sample's error: the error policy applies when its row is loaded
        row.error = e
    finally:
        loader.inflight.end(worker, mark)


def complete(data) -> bool:
    """Whether ``data`` ends like a whole JPEG (the per-sample region path checks this first)."""
    try:
        check_jpeg_complete(data)
        return True
    except DecodeError:
        return False


def decode_regions(loader: SampleLoader, plan: BatchPlan, worker: int) -> int:
    """The planned regions of ``plan`` decoded in one call, into their rows (a region the call
    could not decode is left to the row's finish); the number decoded."""
    group, datas, regions = [], [], []
    for r in plan.rows:
        if r.plan is not None and r.plan.region is not None and complete(r.plan.data):
            group.append(r)
            datas.append(r.plan.data)
            regions.append(r.plan.region)
    if len(group) < MIN_BATCH:
        return 0
    # The watchdog names one sample of the call: a stall here is the whole group's.
    mark = loader.inflight.begin(worker, group[0].index, plan.request.epoch, loader.samples.in_flight(group[0].key))
    try:
        decoded = roi.get_region_decoder().decode_batch(datas, regions)
    finally:
        loader.inflight.end(worker, mark)
    for row, pixels in zip(group, decoded):
        row.pixels = pixels
    return sum(p is not None for p in decoded)


class PerSample:
    """Each row loaded whole, one by one: nothing planned ahead."""

    plans = False

    def decode_batch(self, loader: SampleLoader, plan: BatchPlan, worker: int) -> None:
        """Nothing is decoded for the batch as a whole."""


class BatchedRegions:
    """Every row planned first, the planned regions (if any) decoded in one call, then each row finished."""

    plans = True

    def decode_batch(self, loader: SampleLoader, plan: BatchPlan, worker: int) -> None:
        decode_regions(loader, plan, worker)


CpuExecutor = Union[PerSample, BatchedRegions]


def cpu_executor(samples: Samples | RecordSamples) -> CpuExecutor:
    """How batches of ``samples`` are decoded on the CPU: planned ahead, the regions planned
    (for samples whose bytes were verified strictly before, or with the deprecated
    ``FASTLOAD_ROI=trusted``) decoded in one call, where the dataset plans; else sample by sample.

    Planning a batch ahead costs nothing where no region is planned, and is the cheaper order
    even then: its reads and header checks first, then its decodes back to back (about 3% less
    CPU per image than each sample planned and finished in turn, measured on the photo set)."""
    return BatchedRegions() if samples.plans else PerSample()
