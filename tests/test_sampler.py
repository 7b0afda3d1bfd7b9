import numpy as np
import pytest

from fastload.sources.sampler import ShardedBatchSampler


def _epoch(n, bs, world, **kw):
    return [[b.indices.tolist() for b in ShardedBatchSampler(n, bs, rank=r, world_size=world, **kw)]
            for r in range(world)]


def test_ranks_are_disjoint_and_cover_everything():
    per_rank = _epoch(100, 8, 4, shuffle=True, seed=3)
    flat = [i for rank in per_rank for batch in rank for i in batch]
    assert sorted(flat) == list(range(100))
    assert len({len(r) for r in per_rank}) == 1


def test_padding_repeats_head_like_distributed_sampler():
    per_rank = _epoch(10, 4, 3)
    counts = np.bincount([i for r in per_rank for b in r for i in b], minlength=10)
    assert counts.sum() == 12 and counts.min() == 1 and (counts == 2).sum() == 2
    assert [len(r) for r in per_rank] == [1, 1, 1]  # ceil(10 / 3) = 4 samples each: one batch of 4


def test_drop_last_gives_equal_full_batches():
    per_rank = _epoch(103, 8, 2, drop_last=True, shuffle=True)
    assert all(len(b) == 8 for r in per_rank for b in r)
    assert [len(r) for r in per_rank] == [6, 6]
    assert len(ShardedBatchSampler(103, 8, drop_last=True, world_size=2)) == 6


def test_set_epoch_reshuffles_deterministically():
    s = ShardedBatchSampler(50, 50, shuffle=True, seed=1)
    first = next(iter(s)).indices.tolist()
    s.set_epoch(1)
    second = next(iter(s))
    assert second.epoch == 1 and second.indices.tolist() != first
    again = ShardedBatchSampler(50, 50, shuffle=True, seed=1)
    again.set_epoch(1)
    assert next(iter(again)).indices.tolist() == second.indices.tolist()


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank 2"):
        ShardedBatchSampler(10, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="no batch"):
        ShardedBatchSampler(5, 8, drop_last=True)
    with pytest.raises(ValueError, match="batch_size"):
        ShardedBatchSampler(5, 0)
