"""What the process and thread sources share: an indexed dataset and this rank's sampler."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .fetch import BatchFetcher
from .sampler import BatchRequest, ShardedBatchSampler

if TYPE_CHECKING:
    from .resume import Plan


class IndexedSource:
    """The sampler side of a :class:`~fastload.sources.BatchSource` over an indexed dataset."""

    fetcher: BatchFetcher
    sampler: ShardedBatchSampler

    @property
    def dataset(self) -> Any:
        return self.fetcher.dataset

    @property
    def num_samples(self) -> int:
        return self.sampler.num_samples

    def __len__(self) -> int:
        return len(self.sampler)

    def requests(self, epoch: int, plan: Plan | None) -> list[BatchRequest] | None:
        """A resumed pass's explicit requests (None: the sampler's own for ``epoch``)."""
        return None if plan is None else list(plan.requests)

    def resume_plan(self, state: dict) -> Plan | None:
        from . import resume

        return resume.plan(state, self.sampler.num_samples, self.sampler.rank, self.sampler.world_size)

    def state_fields(self) -> dict:
        return {}
