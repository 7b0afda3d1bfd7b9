"""What the process and thread sources share: an indexed dataset and this rank's sampler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import resume
from .request import BatchRequest, PassRequest
from .sampler import ShardedBatchSampler


class IndexedSource:
    """The sampler side of a :class:`~fastload.sources.BatchSource` over an indexed dataset."""

    maker: Any  # a BatchMaker or PackMaker: its loader names the samples
    sampler: ShardedBatchSampler

    @property
    def dataset(self) -> Any:
        return self.maker.loader.dataset

    @property
    def num_samples(self) -> int:
        return self.sampler.num_samples

    def __len__(self) -> int:
        return len(self.sampler)

    def requests(self, run: PassRequest) -> Iterator[BatchRequest]:
        """The batch requests of pass ``run``: its epoch's, or the rest of it that ``run.resumed`` says."""
        if run.resumed is None:
            return self.sampler.requests(run.epoch, run.seed)
        return run.resumed.requests(run.seed, self.sampler.rank, run.first)

    def reshard(self, rank: int, world_size: int, order_seed: int) -> None:
        """Deals this rank's share anew for another rank, world size or order seed (no new workers)."""
        self.sampler = self.sampler.resharded(rank, world_size, order_seed)

    def resume_point(self, state: dict) -> resume.IndexedResume | None:
        return resume.indexed_resume(state, self.sampler.num_samples, self.sampler.rank, self.sampler.world_size)

    def state_fields(self) -> dict:
        return {}
