"""decode="gpu" with both decoders at once: the workers decode ``gpu_cpu_share`` of each
batch's GPU-decodable rows by the CPU path, the GPU the rest (fastload.device.gpudecode.share).

On this CPU machine the GPU executor runs with nvImageCodec's CPU backend
(FASTLOAD_GPU_DECODE_ON_CPU=1); the CUDA stream simulator runs it "on a GPU"."""

import math
import os
import re

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, make_image, photo_jpegs
from test_gpu_decode import BATCH_TOLERANCE, IMAGE_TOLERANCE, _odd_ones, _photos, _write

import fastload as fl
from fastload.decode import roi
from fastload.device.gpudecode import GpuPipeline
from fastload.device.gpudecode.share import AUTO_MAX, AUTO_START, CpuShare
from fastload.sources import InFlight
from fastload.sources.fetch import SampleLoader
from fastload.sources.indexed import IndexedSource
from fastload.sources.packed import PackMaker
from fastload.sources.pools import PlainPool
from fastload.sources.request import BatchRequest, PassRequest
from fastload.sources.sampler import ShardedBatchSampler
from fastload.sources.samples import Samples

needs_roi = pytest.mark.skipif(not roi.available(), reason="GPU decode needs nvImageCodec: fastload[roi]")


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")


def _run(ds, decode, **kw):
    opts = dict(batch_size=8, num_workers=0, device="cpu", normalize=False, shuffle=True, return_index=True, seed=0,
                stall_warning=0)
    opts.update(kw)
    with fl.Loader(ds, decode=decode, **opts) as loader:
        out = [tuple(t.clone() for t in b) for b in loader]
        return out, loader.stats()


# --- the worker's side: which rows it decodes ------------------------------------------------


def _pack(ds, share):
    maker = PackMaker(SampleLoader(Samples(ds), "raise", InFlight(1)), GpuPipeline.of(ds))
    return maker.make(BatchRequest(0, np.arange(len(ds)), seed=3, cpu_share=share), 0, PlainPool(pin=False))


@needs_roi
@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_the_worker_decodes_the_first_share_of_the_gpu_decodable_rows(tmp_path, share):
    files = {**_photos(8), **_odd_ones()}  # 8 photos and a grey JPEG: 9 the GPU takes, 3 it does not
    ds = fl.ImageFolder(_write(tmp_path, files), fl.transforms.train(48))
    names = [os.path.basename(ds.describe(i)) for i in range(len(ds))]
    odd = {j for j, name in enumerate(names) if name in ("png.png", "cmyk.jpg", "progressive.jpg")}
    encodable = [j for j in range(len(ds)) if j not in odd]
    k = math.floor(share * len(encodable) + 0.5)
    batch, alone = _pack(ds, share), _pack(ds, 0.0)
    assert sorted(batch.decoded_rows.tolist()) == sorted(odd | set(encodable[:k]))
    assert batch.rows.tolist() == encodable[k:]
    assert batch.cpu_share_rows == k and (batch.cpu_seconds > 0) == (k > 0)
    assert batch.decoded.shape == (len(odd) + k, 48, 48, 3)
    # The rows left to the GPU are packed as without a share: same bytes, geometry and flip draws.
    same = np.isin(alone.rows, batch.rows)
    assert np.array_equal(alone.flips[same], batch.flips) and np.array_equal(alone.boxes[same], batch.boxes)
    assert alone.cpu_share_rows == 0 and alone.rows.tolist() == encodable


@needs_roi
def test_rows_decoded_for_the_share_are_the_cpu_paths_exactly(tmp_path):
    """Default (reduced) decode, where the CPU path's pixels differ from a full decode's: the
    rows a worker decodes for the share are decode="cpu"'s, byte for byte."""
    ds = fl.ImageFolder(_write(tmp_path, _photos(8)), fl.transforms.train(48))
    batch = _pack(ds, 0.5)
    assert batch.cpu_share_rows == 4 and batch.decoded_rows.tolist() == [0, 1, 2, 3]
    for k, j in enumerate(batch.decoded_rows):
        want, label = ds.load(int(j), 0, 3)
        assert np.array_equal(batch.decoded[k].numpy(), want) and int(batch.labels[j]) == label


# --- whole loaders -------------------------------------------------------------------------


@needs_roi
def test_share_zero_leaves_every_decodable_row_to_the_gpu(tmp_path, on_cpu):
    ds = fl.ImageFolder(_write(tmp_path, {**_photos(10), **_odd_ones()}), fl.transforms.train(48))
    out, stats = _run(ds, "gpu", gpu_cpu_share=0)
    assert stats["cpu_share_rows"] == 0 and stats["gpu_decoded_rows"] == 11 and stats["gpu_cpu_share"] == 0
    _, none = _run(ds, "gpu", gpu_cpu_share=None)
    assert none["cpu_share_rows"] == 0 and none["gpu_decoded_rows"] == 11


@needs_roi
def test_share_one_leaves_the_gpu_nothing(tmp_path, on_cpu):
    ds = fl.ImageFolder(_write(tmp_path, {**_photos(10), **_odd_ones()}), fl.transforms.train(48))
    _, stats = _run(ds, "gpu", gpu_cpu_share=1.0, num_workers=1)
    assert stats["cpu_share_rows"] == 11 and stats["gpu_decoded_rows"] == 0


@needs_roi
def test_a_fixed_share_is_reproducible_and_equals_decode_cpu_on_photos(tmp_path, on_cpu):
    photos = {f"{i:02d}.jpg": data for i, data in enumerate(photo_jpegs((300, 420), 1, seed=5))}
    ds = fl.ImageFolder(_write(tmp_path, photos), fl.transforms.train(96, reduced_decode=False))
    kw = dict(gpu_cpu_share=0.5, num_workers=2, batch_size=5)
    first, stats = _run(ds, "gpu", **kw)
    second, _ = _run(ds, "gpu", **kw)
    cpu, _ = _run(ds, "cpu", num_workers=2, batch_size=5)
    assert stats["cpu_share_rows"] + stats["gpu_decoded_rows"] == len(ds)  # baseline JPEGs, all
    assert stats["cpu_share_rows"] == sum(math.floor(len(b[0]) / 2 + 0.5) for b in first) > 0
    for a, b, c in zip(first, second, cpu, strict=True):
        for ta, tb, tc in zip(a, b, c):
            assert torch.equal(ta, tb) and torch.equal(ta, tc)


@needs_roi
def test_a_share_on_photos_is_the_cpu_paths_rows_and_the_gpus_within_tolerance(tmp_path, on_cpu):
    """Reduced decode (the default): the rows the workers took equal decode="cpu"'s, the GPU's
    differ within the documented tolerance."""
    photos = {f"{i:02d}.jpg": data for i, data in enumerate(photo_jpegs((300, 420), 1, seed=5))}
    ds = fl.ImageFolder(_write(tmp_path, photos), fl.transforms.train(112))
    gpu, _ = _run(ds, "gpu", gpu_cpu_share=0.5, batch_size=6)
    cpu, _ = _run(ds, "cpu", batch_size=6)
    differ = 0
    for (xg, yg, ig), (xc, yc, ic) in zip(gpu, cpu, strict=True):
        assert torch.equal(yg, yc) and torch.equal(ig, ic)
        k = math.floor(len(xg) / 2 + 0.5)
        assert torch.equal(xg[:k], xc[:k])  # all photos are baseline JPEGs: the first k are the share
        diff = (xg[k:].float() - xc[k:].float()).abs().mean(dim=(1, 2, 3))
        assert diff.max() <= IMAGE_TOLERANCE and diff.mean() <= BATCH_TOLERANCE, diff
        differ += int((diff > 0).sum())
    assert differ > 0, "the GPU's rows equal the CPU path's here: the check above tells nothing"


@needs_roi
def test_auto_measures_both_sides_and_moves_the_share(tmp_path, on_cpu):
    ds = fl.ImageFolder(_write(tmp_path, _photos(10)), fl.transforms.train(48))
    _, stats = _run(ds, "gpu", batch_size=2)  # "auto" is the default
    assert stats["cpu_share_rows_per_s"] > 0 and stats["gpu_rows_per_s"] > 0
    assert stats["gpu_cpu_share"] != AUTO_START and 0 <= stats["gpu_cpu_share"] <= AUTO_MAX
    assert stats["cpu_share_rows"] + stats["gpu_decoded_rows"] == 10 and stats["cpu_share_rows"] >= 1


@needs_roi
def test_rows_the_decoder_refuses_under_a_share_are_counted_as_fallbacks_not_gpu_rows(tmp_path, on_cpu, refuse):
    ds = fl.ImageFolder(_write(tmp_path, _photos(8)), fl.transforms.train(64, reduced_decode=False))
    refuse.update({5, 6})  # batch rows; 0-3 are the workers' (share 0.5 of 8)
    gpu, stats = _run(ds, "gpu", gpu_cpu_share=0.5)
    cpu, _ = _run(ds, "cpu")
    for a, b in zip(gpu, cpu, strict=True):
        assert all(torch.equal(ta, tb) for ta, tb in zip(a, b))
    assert (stats["cpu_share_rows"], stats["gpu_decoded_rows"], stats["cpu_fallback_rows"]) == (4, 2, 2)


# --- the requests carry the share ------------------------------------------------------------


def test_each_request_takes_the_share_of_the_moment_it_is_sent():
    share = [0.1]

    class Source(IndexedSource):
        def __init__(self):
            self.sampler = ShardedBatchSampler(8, 2, shuffle=False, seed=0, rank=0, world_size=1)
            self.cpu_share = lambda: share[0]

    requests = Source().requests(PassRequest(0, 0))
    first = next(requests)
    share[0] = 0.7  # read as each is drawn (DataLoader draws a request as it sends it)
    assert first.cpu_share == 0.1 and [r.cpu_share for r in requests] == [0.7, 0.7, 0.7]
    assert [int(r.indices[0]) for r in Source().requests(PassRequest(0, 0))] == [0, 2, 4, 6]


# --- the option ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), "half", True, [0.5]])
def test_a_bad_share_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match=r"gpu_cpu_share must be a number in \[0, 1\], 'auto' or None, got "
                       + re.escape(repr(value))):
        fl.LoaderConfig(gpu_cpu_share=value)


def test_the_share_option_takes_numbers_auto_and_none():
    assert fl.LoaderConfig().gpu_cpu_share == "auto"
    assert fl.LoaderConfig(gpu_cpu_share=1).gpu_cpu_share == 1.0
    assert fl.LoaderConfig(gpu_cpu_share=np.float32(0.25)).gpu_cpu_share == 0.25
    assert fl.LoaderConfig(gpu_cpu_share=None).gpu_cpu_share is None
    cfg = fl.LoaderConfig(gpu_cpu_share=0.3)
    assert fl.LoaderConfig(**cfg.to_dict()) == cfg


# --- "auto": the controller, on injected timings --------------------------------------------


def _steer(share, cpu_row_s, gpu_row_s, gpu_batch_s=0.0, rows=100, batches=60):
    """Feeds ``share`` batches of ``rows`` GPU-decodable rows, timed as a worker taking
    ``cpu_row_s`` per row and the GPU ``gpu_row_s`` per row plus ``gpu_batch_s`` per batch."""
    for _ in range(batches):
        k = math.floor(share.current() * rows + 0.5)
        share.observe_cpu(k, k * cpu_row_s)
        share.observe_gpu(rows - k, gpu_batch_s + (rows - k) * gpu_row_s)
    return share.current()


@pytest.mark.parametrize("workers, cpu_row_s, threads, gpu_row_s",
                         [(4, 2e-3, 1, 1e-3), (14, 1.8e-3, 2, 0.44e-3), (2, 5e-3, 1, 0.1e-3)])
def test_auto_converges_to_the_share_where_the_rates_add(workers, cpu_row_s, threads, gpu_row_s):
    """Each side's rate: its batches in progress at once (workers; driver threads) over its time per row."""
    rate_cpu, rate_gpu = workers / cpu_row_s, threads / gpu_row_s
    share = CpuShare("auto", workers, gpu_threads=threads)
    assert share.current() == AUTO_START and share.target() is None
    got = _steer(share, cpu_row_s, gpu_row_s)
    assert got == pytest.approx(rate_cpu / (rate_cpu + rate_gpu), abs=0.01)
    assert share.rates() == (pytest.approx(rate_cpu), pytest.approx(rate_gpu))


def test_auto_balances_the_two_sides_time_per_batch_with_a_fixed_cost_per_batch():
    workers, c, g, fixed, rows = 8, 2e-3, 0.1e-3, 8e-3, 200
    s = _steer(CpuShare("auto", workers), c, g, fixed, rows=rows, batches=200)
    cpu_time, gpu_time = s * rows * c / workers, fixed + (1 - s) * rows * g
    assert cpu_time == pytest.approx(gpu_time, rel=0.05)


@pytest.mark.parametrize("cpu_row_s, gpu_row_s, bound", [(1e-6, 1.0, AUTO_MAX), (1.0, 1e-7, 0.0)])
def test_auto_stays_within_its_bounds(cpu_row_s, gpu_row_s, bound):
    assert _steer(CpuShare("auto", 4), cpu_row_s, gpu_row_s) == pytest.approx(bound, abs=1e-3)


def test_a_fixed_share_does_not_move():
    assert _steer(CpuShare(0.3, 4), 1e-6, 1.0) == 0.3
    assert _steer(CpuShare(None, 4), 1e-6, 1.0) == 0.0


# --- on simulated GPUs ---------------------------------------------------------------------


def _sim_photos(tmp_path, monkeypatch):
    from cudasim import decoder

    os.makedirs(tmp_path / "a")
    for i in range(24):
        (tmp_path / "a" / f"{i:02d}.jpg").write_bytes(jpeg_bytes(make_image(i, 60 + 3 * i, 80 + 2 * i)))
    monkeypatch.setattr("fastload.device.gpudecode.executor.BatchDecoder", decoder.decoder)
    return fl.ImageFolder(str(tmp_path), fl.transforms.train(32, reduced_decode=False))


@needs_roi
@pytest.mark.sim(seed=0)
@pytest.mark.parametrize("share", [0.5, "auto"])
def test_a_share_on_a_simulated_gpu_is_race_free_and_within_a_level_of_the_cpu(sim, tmp_path, monkeypatch, share):
    from cudasim.scenes import read_on_consumer

    ds = _sim_photos(tmp_path, monkeypatch)
    opts = dict(decode="gpu", batch_size=6, num_workers=2, shuffle=True, seed=0, stall_warning=0, normalize=False,
                gpu_cpu_share=share, prefetch_factor=1)
    with fl.Loader(ds, device="cpu", decode="cpu", **{k: v for k, v in opts.items() if k != "decode"}) as cpu:
        want = [x.clone() for _ in range(2) for x, _ in cpu]
    sim.rng.seed(1)  # random completion orders
    got = []
    with fl.Loader(ds, device="cuda", **opts) as ld:
        for _ in range(2):
            for x, y in ld:
                read_on_consumer(x, y)
                got.append(x.cpu())
        stats = ld.stats()
        assert ld._share.gpu_threads == ld._driver.executor.threads >= 2  # the GPU's rate counts its threads
    for g, w in zip(got, want, strict=True):  # the float resize on "CUDA", rounded once: within a level
        assert (g.float() - w.float()).abs().mean() <= 1.0
    assert stats["cpu_share_rows"] > 0 and stats["gpu_decoded_rows"] > 0
    assert stats["cpu_share_rows"] + stats["gpu_decoded_rows"] == 2 * 24
    assert stats["gpu_rows_per_s"] is not None  # the stream's timing events were read (only once passed)
