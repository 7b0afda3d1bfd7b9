"""One batch through plan → one batched region decode → finish, for datasets that plan.

Every sample of the batch is planned first (bytes read, header checked, crop drawn, decode
chosen: :meth:`fastload.ImageDataset.plan`); the samples planned for a region decode then
have their regions decoded in one nvImageCodec call (:meth:`RegionDecoder.decode_batch
<fastload.decode.roi.RegionDecoder.decode_batch>`); each sample is then finished (the
other plans decoded, resize, flip) into its batch row. Plans, draws and pixels are those
of the per-sample path, sample for sample.

A sample that fails anywhere here is loaded again by the per-sample path
(:meth:`BatchFetcher.load <fastload.sources.fetch.BatchFetcher.load>`), which applies the
error policy and names it: the same error (or replacement) the per-sample path gives. A
region the batched call could not decode is decoded alone, so its error is its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..batch import HostBatch
from ..decode import DecodeError, roi
from ..decode.header import check_jpeg_complete
from ..sampleplan import SamplePlan
from ..sampler import BatchRequest
from .fetch import Loaded, assemble, checked

if TYPE_CHECKING:
    from .fetch import BatchFetcher

#: Fewer region plans than this in a batch are decoded one by one (nothing to share).
MIN_BATCH = 2


def plan_all(fetcher: BatchFetcher, indices: list[int], epoch: int, worker: int) -> list[SamplePlan | None]:
    """Each sample's plan, or None where planning failed (it is loaded again, per sample)."""
    plans: list[SamplePlan | None] = []
    for index in indices:
        fetcher.inflight.begin(worker, index, epoch)
        try:
            plans.append(fetcher.dataset.plan(index, epoch, fetcher.seed))
        except Exception:  # the per-sample path meets it again and applies the error policy
            plans.append(None)
        finally:
            fetcher.inflight.end(worker)
    return plans


def complete(data) -> bool:
    """Whether ``data`` ends like a whole JPEG: a region above the cut would decode, so a
    JPEG cut short is finished alone, where the per-sample path's check fails it."""
    try:
        check_jpeg_complete(data)
        return True
    except DecodeError:
        return False


def decode_regions(fetcher: BatchFetcher, plans: list[SamplePlan | None], epoch: int,
                   worker: int) -> dict[int, np.ndarray]:
    """The planned regions, decoded in one call: {position in ``plans``: pixels}; a region
    the call could not decode is left out (decoded alone when its sample is finished)."""
    group = [j for j, p in enumerate(plans) if p is not None and p.region is not None and complete(p.data)]
    if len(group) < MIN_BATCH:
        return {}
    # The watchdog names one sample of the call: a stall here is the whole group's.
    fetcher.inflight.begin(worker, plans[group[0]].index, epoch)
    try:
        decoded = roi.get_region_decoder().decode_batch([plans[j].data for j in group],
                                                        [plans[j].region for j in group])
    finally:
        fetcher.inflight.end(worker)
    return {j: px for j, px in zip(group, decoded) if px is not None}


def fetch_planned(fetcher: BatchFetcher, request: BatchRequest, worker: int = 0,
                  pin: bool | None = None) -> HostBatch:
    """The HostBatch of ``request``: planned, regions decoded in one call, finished."""
    indices, epoch = [int(i) for i in request.indices], request.epoch
    plans = plan_all(fetcher, indices, epoch, worker)
    pixels = decode_regions(fetcher, plans, epoch, worker)

    def load(j: int, out: np.ndarray | None) -> Loaded:
        plan = plans[j]
        if plan is not None:
            fetcher.inflight.begin(worker, plan.index, epoch)
            try:
                image, label = checked(fetcher.dataset.finish(plan, pixels.pop(j, None), out), plan.label, out)
                return Loaded(image, label, plan.index, [])
            except Exception:  # loaded again below, where the error policy applies
                pass
            finally:
                fetcher.inflight.end(worker)
        return fetcher.load(indices[j], epoch, worker, out)

    return assemble(len(indices), load, epoch, fetcher.dataset, pin)
