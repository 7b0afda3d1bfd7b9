"""Under on_error="skip", images of a shape other than the batch's: an odd first sample is its
own error at every batch size, and images that really differ in size are an error of the data,
not samples to skip (which filled the epoch with the first sample, repeated, at batch size 1)."""

import io
import os
import pickle
import re
import tarfile
import threading

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, make_image

import fastload as fl
from fastload.sources.shapes import MANY_MISFITS, NONE_FIT, ShapesDiffer, ShapeTally

RUNNERS = {"in-process": dict(num_workers=0), "threads": dict(num_workers=2, backend="thread"),
           "processes": dict(num_workers=2)}


class Sizes(torch.utils.data.Dataset):
    """Sample i: an image of side ``side(i)`` filled with i, target i."""

    def __init__(self, n, side):
        self.n, self.side = n, side

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = self.side(i)
        return np.full((s, s, 3), i, np.uint8), i


def _first_odd(i):
    return 40 if i == 0 else 24


def _epoch(ds, bs, runner, **kw):
    opts = dict(batch_size=bs, on_error="skip", device="cpu", seed=0, shuffle=False, normalize=False)
    with fl.Loader(ds, **opts, **RUNNERS[runner], **kw) as loader:
        batches = [(x.clone(), y.clone()) for x, y in loader]
        return batches, [s.index for s in loader.skipped]


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("bs", [1, 2, 3])
def test_an_odd_first_sample_is_skipped_alone_at_every_batch_size(bs, runner):
    batches, skipped = _epoch(Sizes(12, _first_odd), bs, runner)
    assert skipped == [0]
    assert all(x.shape[-2:] == (24, 24) for x, _ in batches)
    seen = torch.cat([y for _, y in batches]).tolist()
    assert len(seen) == 12 and sorted(set(seen)) == list(range(1, 12))  # every other sample, one a replacement's twice
    for x, y in batches:  # each row is its target's image
        assert torch.equal(x.flatten(1).float().mean(1), y.float())


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_images_of_many_sizes_are_an_error_of_the_data_under_skip(runner):
    ds = Sizes(96, lambda i: 16 + 2 * (i % 5))
    # Loud either way: ShapesDiffer, or a sample whose replacements all misfit too.
    with pytest.raises((ShapesDiffer, fl.SampleError), match=r"(do not have the batch's shape .*seen: |"
                       r"replacements failed.*but the batch holds ).*fixed output size"):
        _epoch(ds, 1, runner)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_streams_odd_first_record_at_batch_size_one_is_not_repeated_over_the_epoch(tmp_path, runner):
    with tarfile.open(os.path.join(tmp_path, "shard-000000.tar"), "w") as t:
        for k in range(24):  # each of two slots has more than NONE_FIT records
            side = 64 if k == 0 else 32
            for name, value in ((f"s{k:05d}.jpg", jpeg_bytes(make_image(k, side, side))),
                                (f"s{k:05d}.cls", str(k).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(value)
                t.addfile(info, io.BytesIO(value))
    # A stream cannot look past its record: the shape is its slot's first record's, and the
    # rest do not fit. Before: twelve batches of record 0. On threads the slots share one
    # shape, learnt by the first slot to load (one at a time): record 0's, or the other
    # slot's first, and then record 0 is skipped alone.
    try:
        batches, skipped = _epoch(fl.WebDataset(str(tmp_path)), 1, runner)
    except ShapesDiffer as e:
        assert re.search(r"batch's shape \(64, 64, 3\).*seen: \(32, 32, 3\) x\d+", str(e)), e
        return
    assert runner == "threads" and skipped == [0], (runner, skipped)
    seen = [int(y) for _, y in batches]
    assert len(seen) == 24 and set(seen) == set(range(1, 24))  # record 0's row is a neighbour's


def test_a_tenth_of_odd_images_is_never_taken_for_data_of_many_sizes():
    # The tally counts from each epoch's start: early runs of odd images must not trip it (the
    # first rule, 3 misfits outnumbering the fits, tripped 14 of 300 epochs of such data).
    rng, fit, odd = np.random.default_rng(5), (8, 8, 3), (4, 4, 3)
    tally = ShapeTally()
    for epoch in range(2000):
        for got in np.where(rng.random(200) < 0.1, 1, 0):
            tally.count(epoch, fit, odd if got else fit, lambda: "sample")


def test_threads_learn_an_epochs_shape_at_once_and_the_first_learnt_stands():
    # Each thread loads its own head without a lock (a sample that hangs holds up its own batch
    # only: both are in head() together here, or the barrier breaks); thread 1's head, of
    # another shape, learns after thread 0 has and is fitted to its shape: under "skip" its rows
    # are replaced by samples of that shape, and its odd samples reported (before the lock,
    # each thread kept its own shape and a record of the other escaped "skip" as a ValueError).
    import time

    from fastload.datasets.wrap import WrappedDataset
    from fastload.sources.batchplan import BatchPlan
    from fastload.sources.maker import BatchMaker
    from fastload.sources.request import BatchRequest

    barrier, maker, first = threading.Barrier(2, timeout=5), None, set()

    class Two(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i in (0, 4) and i not in first:  # each thread's first sample (4 is loaded again, refit)
                first.add(i)
                barrier.wait()  # broken (an error) unless both threads load at once
            if i == 5:  # thread 1 votes after thread 0 has learnt
                while maker.shape(0) is None:
                    time.sleep(0.01)
            side = 8 if i in (4, 5) else 16
            return np.full((side, side, 3), i, np.uint8), i

    maker = BatchMaker.of(WrappedDataset(Two()), on_error="skip")
    plans = [BatchPlan.of(BatchRequest(0, np.arange(k, k + 4))) for k in (0, 4)]
    heads: list = [None, None]
    threads = [threading.Thread(target=lambda j=j: heads.__setitem__(j, maker.head(plans[j], j))) for j in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert heads[0] is not None and heads[1] is not None, "a thread's head raised (see the warnings)"
    assert not barrier.broken, "the threads did not load their heads at once"
    assert maker.shape(0) == (16, 16, 3)
    for rows, shape in heads:
        assert shape == (16, 16, 3) and len(rows) == 2
        assert all(r.image.shape == (16, 16, 3) for r in rows)
    assert sorted(s.index for r in heads[1][0] for s in r.skipped) == [4, 5]


def test_the_tally_judges_only_dominating_misfits_and_counts_each_epoch_afresh():
    fit, odd = (8, 8, 3), (4, 4, 3)
    tally = ShapeTally()
    for _ in range(NONE_FIT - 1):
        tally.count(0, fit, odd, lambda: "sample")  # misfits alone, not yet enough
    with pytest.raises(ShapesDiffer, match=rf"{NONE_FIT} of the {NONE_FIT} images checked in epoch 0.*sample 9"):
        tally.count(0, fit, odd, lambda: "sample 9")
    tally = ShapeTally()
    tally.count(1, fit, fit, lambda: "sample")
    for _ in range(MANY_MISFITS - 1):
        tally.count(1, fit, odd, lambda: "sample")  # one fit: a run of misfits needs MANY_MISFITS
    for _ in range(MANY_MISFITS):
        tally.count(2, fit, fit, lambda: "sample")  # a new epoch starts from nothing
    for _ in range(MANY_MISFITS):
        tally.count(2, fit, odd, lambda: "sample")  # as many misfits as fits: not more
    with pytest.raises(ShapesDiffer, match=r"\(4, 4, 3\) x33"):
        tally.count(2, fit, odd, lambda: "sample")
    for protocol in (0, pickle.HIGHEST_PROTOCOL):  # a spawned worker's copy counts afresh
        again = pickle.loads(pickle.dumps(tally, protocol))
        for _ in range(NONE_FIT - 1):
            again.count(2, fit, odd, lambda: "sample")
