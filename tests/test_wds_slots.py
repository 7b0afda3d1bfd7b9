"""The WebDataset slot plan: equal slots, each sample once, shuffled shards and windows,
and resumed passes (on other ranks and workers, twice in one epoch) that finish the
epoch exactly once. Pure numpy: no shard is read."""

from types import SimpleNamespace

import numpy as np
import pytest

from fastload.datasets.stream_slots import batch_ranges
from fastload.datasets.webdataset.slots import by_shards, first_pass, fit, resumed_pass, slot_sizes
from fastload.datasets.stream_slots import slot_batches_done


def _slots(counts, num_slots, epoch=0, seed=0, shuffle=True, window=2, drop_last=False, batch_size=None):
    counts = np.asarray(counts, np.int64)
    if batch_size is not None:  # one rank: runs of whole batches
        bounds = batch_ranges(int(counts.sum()), num_slots, batch_size, drop_last)
        return [np.concatenate([np.zeros(0, np.int64), *first_pass(counts, s, num_slots, epoch, seed, shuffle,
                                                                   window, bounds[s])]) for s in range(num_slots)]
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
                                              ((1, 3), (2, 2), [5]), ((2, 1), (2, 1), [1, 4]),
                                              ((1, 3), (1, 2), [7])])
def test_a_resumed_pass_finishes_the_epoch_exactly_once(old, new, consumed):
    counts, bs = np.asarray([9, 6, 8, 10, 4], np.int64), 2
    stage = _stage(old[0], old[1], consumed)
    first = _slots(counts, old[0] * old[1], epoch=3, seed=5, window=2, batch_size=bs if old[0] == 1 else None)
    taken = _consumed(first, stage, bs)
    rest = resumed_pass(counts, new[0] * new[1], [stage], 3, 5, True, bs, False, 2, new[0] == 1)
    left = 37 - len(set(taken))
    if new[0] == 1:  # one rank: whole batches, unpadded
        assert [len(s) for s in rest] == [hi - lo for lo, hi in batch_ranges(left, new[1], bs, False)]
        assert len(np.concatenate(rest)) == left
    else:
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


@pytest.mark.parametrize("total,slots,bs,drop_last", [(209, 2, 16, False), (209, 3, 16, False), (209, 3, 16, True),
                                                      (5, 4, 2, False), (64, 4, 16, True), (0, 2, 4, False)])
def test_one_ranks_slots_are_contiguous_runs_of_whole_batches(total, slots, bs, drop_last):
    ranges = batch_ranges(total, slots, bs, drop_last)
    batches = total // bs if drop_last else -(-total // bs)
    assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert ranges[-1][1] == (batches * bs if drop_last else total)
    for s, (lo, hi) in enumerate(ranges):  # slot s: the batches j with j % slots == s
        mine = len(range(s, batches, slots))
        short = not drop_last and batches and s == (batches - 1) % slots
        assert hi - lo == mine * bs - (batches * bs - total if short else 0)


def test_chunks_read_from_at_most_a_window_of_shards():
    shard_of = np.repeat(np.arange(6), 5)
    numbers = np.random.default_rng(0).permutation(30)
    chunks = by_shards(numbers, shard_of, 2)
    assert np.array_equal(np.concatenate(chunks), numbers)
    assert all(len(set(shard_of[c].tolist())) <= 2 for c in chunks)


def test_an_epoch_resumed_through_one_rank():
    counts, bs = np.asarray([12, 12, 12, 11], np.int64), 3
    s1 = _stage(2, 2, [2, 1])
    taken = _consumed(_slots(counts, 4, window=2), s1, bs)
    mid = resumed_pass(counts, 3, [s1], 0, 0, True, bs, False, 2, True)  # on one rank: whole batches
    s2 = _stage(1, 3, [4])
    taken += _consumed(mid, s2, bs)
    last = resumed_pass(counts, 2, [s1, s2], 0, 0, True, bs, False, 2)
    every = taken + np.concatenate(last).tolist()
    assert set(every) == set(range(47)) and len(taken) == len(set(taken))
