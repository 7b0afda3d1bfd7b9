"""A batch planned first, its regions decoded in one call, for datasets that plan.

Before a batch is loaded, :func:`prepare` plans every sample of it (bytes read, header
checked, crop drawn, decode chosen: :meth:`fastload.ImageDataset.plan`) and decodes the
regions of the samples planned for a region decode in one nvImageCodec call
(:meth:`RegionDecoder.decode_batch <fastload.decode.roi.RegionDecoder.decode_batch>`).
The fetcher then loads the batch as always, finishing each prepared sample
(:meth:`fastload.ImageDataset.finish`: the other decodes, resize, flip) instead of loading
it, so plans, draws, pixels, errors, replacements and their order are those of the
per-sample path, sample for sample.

A sample whose planning fails is not prepared: loading it meets the same error. A region
the batched call could not decode, or one of a JPEG cut short (whose region above the cut
would decode), is decoded alone when its sample is finished, where it fails as on the
per-sample path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..datasets.sampleplan import SamplePlan
from ..decode import DecodeError, roi
from ..decode.header import check_jpeg_complete
from .sampler import BatchRequest

if TYPE_CHECKING:
    from .fetch import BatchFetcher

#: Fewer region plans than this in a batch are decoded one by one (nothing to share).
MIN_BATCH = 2


@dataclass
class Prepared:
    """A sample planned ahead of its batch: its plan and, for a region plan, the region's pixels."""

    plan: SamplePlan
    pixels: np.ndarray | None


def plan_all(fetcher: BatchFetcher, indices: list[int], epoch: int, worker: int, seed: int) -> list[SamplePlan | None]:
    """Each sample's plan, or None where planning failed (loading it meets the error again)."""
    plans: list[SamplePlan | None] = []
    for index in indices:
        fetcher.inflight.begin(worker, index, epoch)
        try:
            plans.append(fetcher.dataset.plan(index, epoch, seed))
        except Exception:  # the per-sample path meets it again and applies the error policy
            plans.append(None)
        finally:
            fetcher.inflight.end(worker)
    return plans


def complete(data) -> bool:
    """Whether ``data`` ends like a whole JPEG (the per-sample region path checks this first)."""
    try:
        check_jpeg_complete(data)
        return True
    except DecodeError:
        return False


def decode_regions(
    fetcher: BatchFetcher, plans: list[SamplePlan | None], epoch: int, worker: int
) -> dict[int, np.ndarray]:
    """The planned regions, decoded in one call: {position in ``plans``: pixels}; a region
    the call could not decode is left out."""
    group = [j for j, p in enumerate(plans) if p is not None and p.region is not None and complete(p.data)]
    if len(group) < MIN_BATCH:
        return {}
    # The watchdog names one sample of the call: a stall here is the whole group's.
    fetcher.inflight.begin(worker, plans[group[0]].index, epoch)
    try:
        decoded = roi.get_region_decoder().decode_batch(
            [plans[j].data for j in group], [plans[j].region for j in group]
        )
    finally:
        fetcher.inflight.end(worker)
    return {j: px for j, px in zip(group, decoded) if px is not None}


def prepare(fetcher: BatchFetcher, request: BatchRequest, worker: int = 0) -> dict[tuple[int, int], Prepared]:
    """The samples of ``request`` planned, their regions decoded in one call, by (index, epoch)."""
    indices, epoch = [int(i) for i in request.indices], request.epoch
    plans = plan_all(fetcher, indices, epoch, worker, request.seed)
    pixels = decode_regions(fetcher, plans, epoch, worker)
    return {(p.index, epoch): Prepared(p, pixels.get(j)) for j, p in enumerate(plans) if p is not None}
