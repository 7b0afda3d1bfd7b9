"""The WebDataset slot plan: equal slots, each sample once, shuffled shards and windows,
and resumed passes (on other ranks and workers, twice in one epoch) that finish the
epoch exactly once. Pure numpy: no shard is read."""

from types import SimpleNamespace

import numpy as np
import pytest

from fastload.datasets.webdataset.slots import by_shards, first_pass, fit, resumed_pass, slot_sizes
from fastload.sources.stream import slot_batches_done


def _slots(counts, num_slots, epoch=0, seed=0, shuffle=True, window=2, drop_last=False):
    counts = np.asarray(counts, np.int64)
    length = slot_sizes(int(counts.sum()), num_slots, drop_last)
    return [np.concatenate(fit(first_pass(counts, s, num_slots, epoch, seed, shuffle, window), length,
                               np.zeros(0, np.int64))) for s in range(num_slots)]


def _shard_of(counts):
    return np.repeat(np.arange(len(counts)), counts)


@pytest.mark.parametrize("num_slots", [1, 3, 4, 7])
def test_every_sample_once_in_equal_slots(num_slots):
    counts = [7, 0, 5, 9, 3, 11]
    slots = _slots(counts, num_slots)
    assert len({len(s) for s in slots}) == 1
    every = np.concatenate(slots)
    assert set(every.tolist()) == set(range(35))
    assert len(every) - 35 == len(slots[0]) * num_slots - 35  # only padding repeats
    short = _slots(counts, num_slots, drop_last=True)
    assert len({len(s) for s in short}) == 1 and len(set(np.concatenate(short).tolist())) == len(short[0]) * num_slots


def test_shards_and_windows_are_shuffled_by_seed_and_epoch():
    counts = [10] * 12
    a, b, c = _slots(counts, 3, epoch=0), _slots(counts, 3, epoch=1), _slots(counts, 3, epoch=0, seed=9)
    assert not all(np.array_equal(x, y) for x, y in zip(a, b)) and not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert all(np.array_equal(x, y) for x, y in zip(a, _slots(counts, 3, epoch=0)))  # a function of (seed, epoch)
    shard_of = _shard_of(counts)
    assert [set(shard_of[s].tolist()) for s in a] != [set(shard_of[s].tolist()) for s in b]  # shards move too
    for slot in a:  # 40 samples: 4 shards, 2 windows of 2 shards, each window permuted within itself
        first, second = set(shard_of[slot[:20]].tolist()), set(shard_of[slot[20:]].tolist())
        assert len(first) == 2 and len(second) == 2 and not first & second
        assert not np.array_equal(slot[:20], np.sort(slot[:20]))
    plain = _slots(counts, 3, shuffle=False)
    assert np.array_equal(np.concatenate(plain), np.arange(120))


def _stage(world_size, num_workers, consumed):
    return SimpleNamespace(world_size=world_size, num_workers=num_workers, consumed=tuple(consumed))


def _consumed(slots, stage, batch_size):
    workers = max(1, stage.num_workers)
    out = []
    for rank, done in enumerate(stage.consumed):
        for local in range(workers):
            out += slots[rank * workers + local][:slot_batches_done(done, local, workers) * batch_size].tolist()
    return out


@pytest.mark.parametrize("old,new,consumed", [((2, 2), (1, 2), [3, 3]), ((2, 2), (3, 1), [2, 1]),
                                              ((1, 3), (2, 2), [5]), ((2, 1), (2, 1), [1, 4])])
def test_a_resumed_pass_finishes_the_epoch_exactly_once(old, new, consumed):
    counts, bs = np.asarray([9, 6, 8, 10, 4], np.int64), 2
    stage = _stage(old[0], old[1], consumed)
    first = _slots(counts, old[0] * old[1], epoch=3, seed=5, window=2)
    taken = _consumed(first, stage, bs)
    rest = resumed_pass(counts, new[0] * new[1], [stage], 3, 5, True, bs, False, 2)
    left = 37 - len(set(taken))
    assert [len(s) for s in rest] == [-(-left // (new[0] * new[1]))] * (new[0] * new[1])
    assert not set(taken) & set(np.concatenate(rest).tolist()), "nothing consumed is read again"
    assert set(taken + np.concatenate(rest).tolist()) == set(range(37))


def test_an_epoch_resumed_twice_on_three_layouts():
    counts, bs = np.asarray([12, 12, 12, 12], np.int64), 3
    s1 = _stage(2, 2, [2, 2])
    taken = _consumed(_slots(counts, 4, window=2), s1, bs)
    mid = resumed_pass(counts, 3, [s1], 0, 0, True, bs, False, 2)
    s2 = _stage(3, 1, [1, 2, 1])
    taken += _consumed(mid, s2, bs)
    last = resumed_pass(counts, 2, [s1, s2], 0, 0, True, bs, False, 2)
    every = taken + np.concatenate(last).tolist()
    assert set(every) == set(range(48)) and len(taken) == len(set(taken))
    with pytest.raises(ValueError, match="rank 1 of 3 consumed 9 batches"):
        resumed_pass(counts, 2, [s1, _stage(3, 1, [1, 9, 1])], 0, 0, True, bs, False, 2)


def test_chunks_read_from_at_most_a_window_of_shards():
    shard_of = np.repeat(np.arange(6), 5)
    numbers = np.random.default_rng(0).permutation(30)
    chunks = by_shards(numbers, shard_of, 2)
    assert np.array_equal(np.concatenate(chunks), numbers)
    assert all(len(set(shard_of[c].tolist())) <= 2 for c in chunks)
