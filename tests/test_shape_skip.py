"""Under on_error="skip", images of a shape other than the batch's: an odd first sample is its
own error at every batch size, and images that really differ in size are an error of the data,
not samples to skip (which filled the epoch with the first sample, repeated, at batch size 1)."""

import io
import os
import pickle
import re
import tarfile

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, make_image

import fastload as fl
from fastload.sources.shapes import MIN_MISFITS, ShapesDiffer, ShapeTally

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
    ds = Sizes(24, lambda i: 16 + 2 * (i % 5))
    with pytest.raises(ShapesDiffer, match=r"do not have the batch's shape .*seen: .*fixed output size"):
        _epoch(ds, 1, runner)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_streams_odd_first_record_at_batch_size_one_is_not_repeated_over_the_epoch(tmp_path, runner):
    with tarfile.open(os.path.join(tmp_path, "shard-000000.tar"), "w") as t:
        for k in range(12):
            side = 64 if k == 0 else 32
            for name, value in ((f"s{k:05d}.jpg", jpeg_bytes(make_image(k, side, side))),
                                (f"s{k:05d}.cls", str(k).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(value)
                t.addfile(info, io.BytesIO(value))
    # A stream cannot look past its record: the shape is its slot's first record's, and the
    # rest do not fit. Before: twelve batches of record 0. On threads the two slots learn
    # the shape at once and the last one's stands (a race left as it is): the other slot's
    # 32 when it comes last, and one record, 0 or the first slot's next, is skipped alone, or
    # none (record 0's batch made before the other shape stood).
    try:
        batches, skipped = _epoch(fl.WebDataset(str(tmp_path)), 1, runner)
    except ShapesDiffer as e:
        assert re.search(r"batch's shape \(64, 64, 3\).*seen: \(32, 32, 3\)", str(e)), e
        return
    assert runner == "threads" and len(skipped) <= 1, (runner, skipped)
    seen = [int(y) for _, y in batches]
    assert len(seen) == 12 and set(seen) == set(range(12)) - set(skipped)  # its row is a neighbour's


def test_the_tally_judges_only_when_misfits_outnumber_fits_and_counts_each_epoch_afresh():
    tally, fit, odd = ShapeTally(), (8, 8, 3), (4, 4, 3)
    for _ in range(MIN_MISFITS - 1):
        tally.count(0, fit, odd, "sample")  # misfits alone, but too few to judge
    for _ in range(MIN_MISFITS):
        tally.count(0, fit, fit, "sample")
    tally.count(0, fit, odd, "sample")  # 3 misfits against 3 fits: not more
    with pytest.raises(ShapesDiffer, match=r"4 of the 7 images checked in epoch 0.*\(4, 4, 3\) x4"):
        tally.count(0, fit, odd, "sample 9")
    for _ in range(MIN_MISFITS - 1):
        tally.count(1, fit, odd, "sample")  # a new epoch starts from nothing
    again = pickle.loads(pickle.dumps(tally))  # a spawned worker's copy counts afresh
    for _ in range(MIN_MISFITS - 1):
        again.count(1, fit, odd, "sample")
