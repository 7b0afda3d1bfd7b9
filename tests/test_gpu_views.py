"""decode="gpu" with a multi-view transform (``fl.transforms.MultiView`` of presets): each image
decoded once, each view cut, resized and flipped from it into its own tensor, its crop and flip
drawn in the worker as the CPU path's MultiView draws them.

On this CPU machine the executor runs with nvImageCodec's CPU backend and torch on the CPU
(FASTLOAD_GPU_DECODE_ON_CPU=1): with ``reduced_decode=False`` every view's pixels are the CPU
path's, exactly (as tests/test_gpu_decode.py and tests/test_gpu_streams.py compare one view's).
"""

import os

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, make_image, png_bytes
from PIL import Image
from test_gpu_streams import _batches, _corrupt, _odd_ones, _stream

import fastload as fl
from fastload.decode import roi
from fastload.device.gpudecode import GpuPipeline, GpuViews
from fastload.sources import InFlight
from fastload.sources.fetch import SampleLoader
from fastload.sources.packed import PackMaker
from fastload.sources.pools import PlainPool
from fastload.sources.request import BatchRequest
from fastload.sources.samples import Samples

pytestmark = pytest.mark.skipif(not roi.available(), reason="GPU decode needs nvImageCodec: fastload[roi]")

RUNNERS = {"in-process": dict(num_workers=0), "threads": dict(num_workers=2, backend="thread"),
           "processes": dict(num_workers=2, backend="process")}


@pytest.fixture(scope="module")
def _cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(autouse=True)
def _on_cpu(_cache, monkeypatch):
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    # WebDataset's indexes, and the decode costs (calibrated once for the module, not per test).
    monkeypatch.setenv("XDG_CACHE_HOME", _cache)


def _views(centre=False):
    """Crops of two kinds: a large one, two small ones (a small image's views fit in a region
    of it, often); with ``centre``, a centre crop too (its box is the whole image: a full decode)."""
    pipelines = [fl.transforms.train(48, scale=(0.05, 0.3), reduced_decode=False),
                 fl.transforms.train(24, scale=(0.02, 0.1), reduced_decode=False)]
    centred = [fl.transforms.eval(32, reduced_decode=False)] if centre else []
    return fl.transforms.MultiView(pipelines + centred, counts=[1, 2] + [1] * centre)


def _photos(n):
    return [jpeg_bytes(make_image(i, 140 + 9 * i, 190 + 7 * i)) for i in range(n)]


def _folder(root, images, centre=False):
    os.makedirs(os.path.join(root, "a"), exist_ok=True)
    for k, data in enumerate(images):
        with open(os.path.join(root, "a", f"{k:02d}.img"), "wb") as f:
            f.write(data)
    return fl.ImageFolder(str(root), _views(centre), extensions=(".img",))


def _assert_same(a, b):
    """Every batch equal: each view's pixels (exactly), targets and indices."""
    assert len(a) == len(b)
    for (xa, ya, ia), (xb, yb, ib) in zip(a, b):
        assert torch.equal(ia, ib) and torch.equal(ya, yb), (ia, ib)
        assert [v.shape for v in xa] == [v.shape for v in xb] and len(xa) >= 3
        for k, (va, vb) in enumerate(zip(xa, xb)):
            assert torch.equal(va, vb), (k, ia)


@pytest.mark.parametrize("centre", [False, True])
@pytest.mark.parametrize("runner", [pytest.param(r, marks=[pytest.mark.slow] if r == "processes" else [])
                                    for r in RUNNERS])
def test_an_indexed_datasets_views_on_the_gpu_are_the_cpu_paths(tmp_path, runner, centre):
    images = _photos(10) + list(_odd_ones())  # a PNG, CMYK, progressive: the CPU path's rows
    ds = _folder(tmp_path, images, centre)
    gpu, stats, _ = _batches(ds, "gpu", gpu_cpu_share=0, **RUNNERS[runner])
    cpu, _, _ = _batches(ds, "cpu", **RUNNERS[runner])
    _assert_same(gpu, cpu)
    assert stats["gpu_decoded_rows"] == 2 * 11 and stats["cpu_fallback_rows"] == 0


def test_the_workers_pack_one_image_per_sample_with_each_views_geometry_and_flip(tmp_path):
    """What the identities above rest on: each JPEG is packed once, with a table per view;
    some decoded as their views' union region, some whole; the views' flips drawn apart."""
    ds = _folder(tmp_path, _photos(12))
    rows = GpuPipeline.of(ds)
    assert isinstance(rows, GpuViews) and rows.out_sizes == ((48, 48), (24, 24), (24, 24))
    maker = PackMaker(SampleLoader(Samples(ds), "raise", InFlight(1)), rows)
    batch = maker.make(BatchRequest(0, np.arange(12)), 0, PlainPool(pin=False))
    tables = batch.views()
    assert len(batch.rows) == 12 and len(tables) == 3 and batch.multiview
    regional = batch.regions[:, 0] >= 0
    assert regional.any() and not regional.all(), batch.regions
    for r in np.flatnonzero(regional):  # every view's box inside the one region
        y0, x0, y1, x1 = batch.regions[r]
        assert all(0 <= t.boxes[r, 0] < t.boxes[r, 2] <= y1 - y0 and t.boxes[r, 3] <= x1 - x0 for t in tables)
    flips = np.stack([t.flips for t in tables])
    assert (flips[0] != flips[1]).any() and (flips[1] != flips[2]).any()


def test_views_of_rows_the_decoder_refuses_are_the_cpu_paths(tmp_path, refuse):
    ds = _folder(tmp_path, _photos(10))
    refuse.update({1, 2})
    gpu, stats, _ = _batches(ds, "gpu", gpu_cpu_share=0)  # every row to the decoder
    cpu, _, _ = _batches(ds, "cpu")
    _assert_same(gpu, cpu)
    assert stats["cpu_fallback_rows"] == 2 * (2 + 2 + 1)  # rows 1 and 2 of batches of 4, 4 and 2; two epochs


@pytest.mark.parametrize("kind", [pytest.param("tfrecord", marks=pytest.mark.slow), "wds"])
@pytest.mark.parametrize("runner", ["in-process", "threads"])
def test_a_streams_views_with_failed_records_are_the_cpu_paths(tmp_path, kind, runner):
    """Cut short under on_error="skip": record 0 (a hole: the first good row after it fills
    it, on the device), 4 (first of its batch: the slot's last good record, 3, a PNG whose
    views' pixels were kept) and 8 (record 7's packed row, decoded again), every view as
    decode="cpu" fills it."""
    images = _photos(10)
    for k in (0, 4, 8):
        images[k] = images[k][: len(images[k]) // 2]
    images[3] = png_bytes(Image.fromarray(make_image(3, 150, 200)))
    ds = _stream(kind, tmp_path / kind, images, _views())
    with pytest.warns(RuntimeWarning, match="skipped"):
        gpu, stats, skipped = _batches(ds, "gpu", epochs=(0,), gpu_cpu_share=0, on_error="skip", **RUNNERS[runner])
        cpu, _, cpu_skipped = _batches(ds, "cpu", epochs=(0,), on_error="skip", **RUNNERS[runner])
    assert sorted(skipped) == sorted(cpu_skipped) == [0, 4, 8]
    if runner == "in-process":  # one slot (threads read two, each with its own neighbours)
        assert [i.tolist() for _, _, i in gpu] == [[1, 1, 2, 3], [3, 5, 6, 7], [7, 9]]
    _assert_same(gpu, cpu)


@pytest.mark.parametrize("kind", [pytest.param("tfrecord", marks=pytest.mark.slow), "wds"])
def test_a_streams_refused_views_and_a_damaged_record_are_the_cpu_paths(tmp_path, kind, refuse):
    """Every row refused: each is planned again from its bytes with the same draws; record 6
    (damaged: the strict CPU decode refuses it) is skipped, its row in every view its
    neighbour's (record 5), as decode="cpu" fills it."""
    images = _photos(10)
    images[6] = _corrupt(images[6])
    ds = _stream(kind, tmp_path / kind, images, _views())
    refuse.update(range(4))
    with pytest.warns(RuntimeWarning, match="skipped"):
        gpu, stats, skipped = _batches(ds, "gpu", epochs=(0,), gpu_cpu_share=0, on_error="skip")
        cpu, _, cpu_skipped = _batches(ds, "cpu", epochs=(0,), on_error="skip")
    assert skipped == cpu_skipped == [6] and stats["cpu_fallback_rows"] == 10
    assert [i.tolist() for _, _, i in gpu][1] == [4, 5, 5, 7]
    _assert_same(gpu, cpu)


def test_a_view_gpu_decode_cannot_run_is_named(tmp_path):
    cropped_twice = [fl.transforms.RandomResizedCrop(16), fl.transforms.CenterCrop(8)]
    tf = fl.transforms.MultiView([fl.transforms.train(16), cropped_twice])
    ds = fl.ImageFolder(_folder(tmp_path, _photos(2)).root, tf, extensions=(".img",))
    with pytest.raises(ValueError, match=r"at most a RandomHorizontalFlip .*\(pipeline 1 of MultiView.*decode='cpu'"):
        fl.Loader(ds, device="cpu", decode="gpu", num_workers=0)
