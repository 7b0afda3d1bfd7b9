"""The batched CPU region path: plan every sample, decode the batch's regions in one call, finish."""

import os

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.decode import costs, plan, roi
from fastload.sources.maker import BatchMaker
from fastload.sources.pools import PlainPool
from fastload.sources.request import BatchRequest

from conftest import jpeg_bytes, make_image

ROI = pytest.mark.skipif(not roi.available(), reason="region decode needs: pip install 'fastload[roi]'")


Clean = fl.ImageFolder  # its files trusted: the fixture's planner plans region decodes


class CleanPerSample(Clean):
    def load(self, index, epoch=0, seed=0, out=None):  # overridden here: the per-sample path runs
        return super().load(index, epoch, seed, out)


def _folder(root, n=12, bad=None):
    os.makedirs(os.path.join(root, "a"), exist_ok=True)
    for i in range(n):
        data = jpeg_bytes(make_image(i, 150 + 7 * i, 200 + 5 * i))
        if bad is not None and i in bad:
            data = bad[i](data)
        with open(os.path.join(root, "a", f"{i:02d}.jpg"), "wb") as f:
            f.write(data)
    return str(root)


def _regions_everywhere():
    """This process's planner plans for trusted files and takes a region decode wherever one
    may serve (until the environment names another costs cache)."""
    free = dict(costs.DEFAULT_COSTS, decode={**costs.DEFAULT_COSTS["decode"], "region": [0.0, 0.0, 0.0]})
    plan.set_planner(plan.Planner(free, region=True))


@pytest.fixture
def regions_win(monkeypatch, nvimgcodec_regions):
    """A planner for trusted files (FASTLOAD_ROI=trusted) that takes a region decode wherever one may serve."""
    _regions_everywhere()
    calls = {"batch": 0, "single": 0}
    batch, single = roi.RegionDecoder.decode_batch, roi.RegionDecoder.decode

    def counted_batch(self, datas, regions):
        calls["batch"] += 1
        return batch(self, datas, regions)

    def counted_single(self, *args):
        calls["single"] += 1
        return single(self, *args)

    monkeypatch.setattr(roi.RegionDecoder, "decode_batch", counted_batch)
    monkeypatch.setattr(roi.RegionDecoder, "decode", counted_single)
    yield calls
    plan.set_planner(None)


def _fetch(ds, indices, on_error="raise", epoch=3):
    return BatchMaker.of(ds, on_error).make(BatchRequest(epoch, np.asarray(indices), seed=7), 0, PlainPool())


@ROI
def test_batched_regions_are_byte_identical_to_the_per_sample_path(tmp_path, regions_win):
    root = _folder(tmp_path)
    batched = _fetch(Clean(root, fl.transforms.train(64)), range(12))
    assert regions_win == {"batch": 1, "single": 0}, "one call for the whole batch's regions"
    per_sample = _fetch(CleanPerSample(root, fl.transforms.train(64)), range(12))
    assert regions_win["single"] == 12
    kinds = [Clean(root, fl.transforms.train(64)).plan(i, 3, 7).steps.plan.kind for i in range(12)]
    assert kinds.count("region") == 12
    assert torch.equal(batched.images, per_sample.images)
    assert torch.equal(batched.labels, per_sample.labels) and torch.equal(batched.indices, per_sample.indices)


@ROI
def test_no_region_decode_unless_the_files_are_trusted(tmp_path, regions_win, monkeypatch):
    """The strictness contract: the process planner (FASTLOAD_ROI not 'trusted') plans no
    region decode, batched or not, even where one would cost nothing."""
    monkeypatch.setattr(plan, "DEFAULT_COSTS", plan.get_planner().costs)  # the fixture's free regions
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    plan.set_planner(None)
    root = _folder(tmp_path, 6)
    ds = fl.ImageFolder(root, fl.transforms.train(64))
    assert all(ds.plan(i, 0, 0).region is None for i in range(6))
    _fetch(ds, range(6))
    assert regions_win == {"batch": 0, "single": 0}


def _truncated(data):
    return data[: len(data) // 2]


@ROI
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("where", ["across its region", "below its region"])
def test_a_failing_region_gets_the_per_sample_paths_error_or_replacement(tmp_path, regions_win, on_error, where):
    tf = fl.transforms.train(64, scale=(0.05, 0.2))
    root = _folder(tmp_path, 8)
    # A JPEG cut short below its crop's rows decodes that region without a complaint:
    # only the per-sample path's end-of-image check fails it, and must here too.
    plans = [Clean(root, tf).plan(i, 3, 7) for i in range(8)]
    bad = next(i for i, p in enumerate(plans) if p.region[2] < p.header.height * 0.6)
    path = os.path.join(root, "a", f"{bad:02d}.jpg")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 4] if where == "across its region" else data[: len(data) * 9 // 10])
    results = {}
    for cls in (Clean, CleanPerSample):
        try:
            results[cls] = _fetch(cls(root, tf), range(8), on_error)
        except fl.DecodeError as e:  # it names its sample already
            results[cls] = e
    batched, per_sample = results[Clean], results[CleanPerSample]
    if on_error == "raise":
        assert isinstance(batched, fl.DecodeError) and str(batched) == str(per_sample)
        assert os.path.join("a", f"{bad:02d}.jpg") in str(batched) and "truncated" in str(batched)
    else:
        assert torch.equal(batched.images, per_sample.images) and torch.equal(batched.indices, per_sample.indices)
        assert batched.skipped == per_sample.skipped and batched.skipped[0].index == bad
        assert int(batched.indices[bad]) != bad


@ROI
def test_a_plan_left_by_a_failed_batch_serves_no_other_epoch(tmp_path, regions_win):
    root = _folder(tmp_path, 8, bad={3: _truncated})
    maker = BatchMaker.of(Clean(root, fl.transforms.train(64)))
    with pytest.raises(fl.DecodeError):
        maker.make(BatchRequest(1, np.arange(8), seed=7), 0, PlainPool())  # stops at sample 3: 4-7 stay planned
    again = maker.loader.load(5, 2, seed=7)
    want, _ = CleanPerSample(root, fl.transforms.train(64)).load(5, 2, 7)
    assert np.array_equal(again.image, want)


@ROI
def test_a_region_the_batched_call_cannot_decode_is_decoded_alone(tmp_path, regions_win, monkeypatch):
    root = _folder(tmp_path, 6)
    batch = roi.RegionDecoder.decode_batch

    def refusing_the_third(self, datas, regions):
        out = batch(self, datas, regions)
        return [None if k == 2 else px for k, px in enumerate(out)]

    monkeypatch.setattr(roi.RegionDecoder, "decode_batch", refusing_the_third)
    batched = _fetch(Clean(root, fl.transforms.train(64)), range(6))
    assert regions_win["single"] == 1
    per_sample = _fetch(CleanPerSample(root, fl.transforms.train(64)), range(6))
    assert torch.equal(batched.images, per_sample.images)


@ROI
def test_decode_batch_equals_decode_and_marks_what_it_cannot_decode():
    datas = [jpeg_bytes(make_image(i, 180, 240)) for i in range(3)]
    datas[1] = _truncated(datas[1])
    regions = [(10, 20, 90, 130), (130, 0, 180, 50), (100, 0, 180, 240)]  # row 130 on: cut off in [1]
    rd = roi.get_region_decoder()
    out = rd.decode_batch(datas, regions)
    assert out[1] is None
    for k in (0, 2):
        assert np.array_equal(out[k], rd.decode(datas[k], *regions[k]))


@ROI
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_every_backend_decodes_a_batchs_regions_in_one_call(tmp_path, regions_win, backend):
    """The thread backend runs the batch plan too (issue 33): its batches' regions are decoded
    in one call per batch, with the pixels of the per-sample path."""
    root = _folder(tmp_path)
    opts = dict(batch_size=4, device="cpu", normalize=False, seed=7, return_index=True, backend=backend)
    with fl.Loader(Clean(root, fl.transforms.train(64)), num_workers=2 if backend == "thread" else 0, **opts) as ld:
        got = [tuple(t.clone() for t in out) for out in ld]
    assert regions_win["batch"] == 3 and regions_win["single"] == 0, "one call per batch of 4"
    per_sample = CleanPerSample(root, fl.transforms.train(64))
    with fl.Loader(per_sample, num_workers=0, **{**opts, "backend": "process"}) as ld:
        want = [tuple(t.clone() for t in out) for out in ld]
    assert regions_win["single"] == 12
    assert all(torch.equal(a, b) for x, y in zip(got, want) for a, b in zip(x, y))


@ROI
@pytest.mark.parametrize("kind", ["webdataset", "tfrecord"])
def test_streams_decode_a_batchs_regions_in_one_call(tmp_path, regions_win, monkeypatch, kind):
    """Streams plan their records like any source (issue 33): with region decodes planned (files
    trusted), a batch's regions are decoded in one call, with the pixels of decoding each alone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # No calibration in the new cache: where a system libturbojpeg loads, the default decoder's
    # choice calibrates, and its region decodes would be counted as the batches'.
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    _regions_everywhere()  # again: the planner follows the cache the environment names
    if kind == "webdataset":
        from wds_servers import write_shards

        write_shards(tmp_path / "shards", [6, 6], size=(150, 200))
        make = lambda: fl.WebDataset(str(tmp_path / "shards"), fl.transforms.train(64))  # noqa: E731
    else:
        pytest.importorskip("tfrecord")
        from fastload.convert import convert

        convert(_folder(tmp_path / "f"), str(tmp_path / "records"), "tfrecord", shards=2, progress=False)
        make = lambda: fl.TFRecordStream(str(tmp_path / "records"), fl.transforms.train(64))  # noqa: E731
    opts = dict(batch_size=4, device="cpu", normalize=False, seed=7, num_workers=0)

    def two_epochs():
        with fl.Loader(make(), **opts) as ld:
            return [x.clone() for epoch in range(2) for x, _ in ld]

    batched = two_epochs()
    assert regions_win["batch"] == 6, "one call per batch, 3 batches an epoch"
    from fastload.sources import batchplan

    monkeypatch.setattr(batchplan, "MIN_BATCH", 10**6)  # every region decoded alone
    alone = two_epochs()
    assert regions_win["batch"] == 6 and regions_win["single"] == 24
    assert all(torch.equal(a, b) for a, b in zip(batched, alone))
