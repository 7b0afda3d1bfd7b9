import copy
import io
import json
import os
import subprocess
import sys
import threading
import warnings
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from fastload import transforms as T
from fastload.datasets.base import sample_rng
from fastload.decode import costs, get_decoder, plan, read_header, roi
from fastload.decode.resize import Crop, phase_error, resize_box

from conftest import jpeg_bytes, make_image, need_decoder, photo_jpegs

ROI = pytest.mark.skipif(not roi.available(), reason="region decode needs: pip install 'fastload[roi]'")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def planner_reset():
    yield
    plan.set_planner(None)


# --- the plan -----------------------------------------------------------------------------


def test_header_carries_the_encoded_size():
    data = jpeg_bytes(make_image(0, 50, 70))
    assert read_header(data).nbytes == len(data)
    assert read_header(data) == read_header(data + b"\0")  # not part of equality


def test_region_is_chosen_for_small_crops_and_full_decode_for_whole_images():
    p = plan.Planner(costs.DEFAULT_COSTS, region=True)
    header = read_header(jpeg_bytes(make_image(1, 400, 500)))
    small = p.choose(header, Crop(200, 250, 120, 130, 224, 224))
    assert small.kind == "region" and small.region == (200, 250, 320, 380) and small.origin == (200, 250)
    assert p.choose(header, Crop(0, 0, 400, 500, 224, 224)).region is None
    # Region decode is for baseline 3-component JPEGs only.
    progressive = read_header(_progressive(make_image(1, 400, 500)))
    assert p.choose(progressive, Crop(200, 250, 120, 130, 224, 224)).region is None
    no_region = plan.Planner(costs.DEFAULT_COSTS, region=False)
    assert no_region.choose(header, Crop(200, 250, 120, 130, 224, 224)).region is None


def _progressive(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", progressive=True)
    return buf.getvalue()


def test_dct_scale_only_when_the_crop_keeps_min_ratio_and_exact_phase():
    p = plan.Planner(costs.DEFAULT_COSTS, region=False)
    header = read_header(jpeg_bytes(make_image(2, 1200, 1600)))
    for i in range(300):
        crop = T.RandomResizedCrop(160).plan(1200, 1600, np.random.default_rng(i))
        choice = p.choose(header, crop)
        s = float(choice.scale)
        assert min(crop.height / 160, crop.width / 160) * s >= plan.MIN_RATIO or s == 1
        if s != 1:
            assert phase_error(crop.top * s, crop.height * s / 160) <= 1 / 16
        assert p.choose(header, crop, scales=False).scale == 1
    big = Crop(0, 0, 1200, 1600, 160, 160)
    assert p.choose(header, big).scale < Fraction(1, 2)  # 7.5x shrink: the decode is cheaper reduced
    # Just under the ratio at every scale: full decode.
    tight = Crop(0, 0, 199, 199, 160, 160)
    assert p.choose(header, tight).scale == 1


def test_predicted_cost_is_never_above_full_decode_plus_resize():
    p = plan.Planner(costs.DEFAULT_COSTS, region=True)
    full_only = plan.Planner(costs.DEFAULT_COSTS, region=False)
    for h, w in ((300, 400), (900, 1300)):
        header = read_header(jpeg_bytes(make_image(3, h, w)))
        for i in range(100):
            crop = T.RandomResizedCrop(128).plan(h, w, np.random.default_rng(i))
            assert p.choose(header, crop).cost <= full_only.choose(header, crop, scales=False).cost + 1e-9


def _scaled_costs(**factors: float) -> dict:
    """DEFAULT_COSTS with plan ``key``'s decode model set to ``factor`` x the full decode's."""
    c = copy.deepcopy(costs.DEFAULT_COSTS)
    for key, factor in factors.items():
        c["decode"][key] = [v * factor for v in c["decode"]["full"]]
    return c


def test_another_plan_replaces_the_full_decode_only_beyond_the_margin():
    header = read_header(jpeg_bytes(make_image(10, 375, 500)))
    crop = Crop(50, 60, 250, 300, 224, 224)  # no DCT scale keeps 1.25x: full or fast upsampling
    full = plan.Planner(_scaled_costs(fast=1.0), region=False).predict(header, crop, "full")
    for factor, kind in ((0.99, "full"), (0.97, "full"), (0.8, "full, fast upsampling")):
        p = plan.Planner(_scaled_costs(fast=factor), region=False)
        choice = p.choose(header, crop)
        assert choice.kind == kind, factor
        assert choice.cost <= full and (kind == "full") == (choice.cost == full)


@ROI
def test_region_is_planned_only_for_trusted_files_and_never_changes_the_pixels(planner_reset, monkeypatch):
    """nvImageCodec's region decode cannot see corrupt data (benchmarks/bench_damage.py):
    the process planner plans one only under FASTLOAD_ROI=trusted, with the full decode's pixels."""
    monkeypatch.setattr(plan, "DEFAULT_COSTS", _scaled_costs(region=0.2))  # read under FASTLOAD_NO_CALIBRATION=1
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    # reduced_decode=False: a region or the full decode, whose pixels a region's are.
    pipeline, dec = T.train(64, scale=(0.05, 0.2), reduced_decode=False), get_decoder()
    blobs = photo_jpegs((256, 400), 1, seed=13)[:6]
    kinds, outs = {}, {}
    for setting in ("1", "trusted"):
        monkeypatch.setenv("FASTLOAD_ROI", setting)
        kinds[setting] = [plan.get_planner().choose(hd, pipeline.plan(hd.height, hd.width, sample_rng(0, 0, i)),
                                                    scales=False).kind
                          for i, hd in enumerate(map(read_header, blobs))]
        outs[setting] = [pipeline.decode(b, dec, sample_rng(0, 0, i)) for i, b in enumerate(blobs)]
    assert "region" not in kinds["1"] and kinds["trusted"].count("region") >= 3, kinds
    for a, b in zip(outs["1"], outs["trusted"]):
        assert np.abs(a.astype(np.int16) - b).max() <= 1  # region decode: the full decode's pixels


# --- pixels ---------------------------------------------------------------------------------


@ROI
@pytest.mark.parametrize("backend", ["simplejpeg", "turbojpeg"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_region_decode_is_the_full_decode_cropped(mode, backend):
    blobs = [jpeg_bytes(make_image(4, 181, 243), quality=90, mode=mode)]
    if mode == "RGB":
        blobs += photo_jpegs((256, 512), 1, seed=4)[:6]
    rd, dec = roi.get_region_decoder(), need_decoder(backend)
    rng = np.random.default_rng(0)
    for data in blobs:
        full = dec.decode(data)
        h, w = full.shape[:2]
        for _ in range(6):
            y0, x0 = int(rng.integers(0, h - 8)), int(rng.integers(0, w - 8))
            y1, x1 = int(rng.integers(y0 + 1, h + 1)), int(rng.integers(x0 + 1, w + 1))
            region = rd.decode(data, y0, x0, y1, x1)
            # Measured: identical to both (same IDCT and fancy upsampling as their defaults).
            assert region.shape == (y1 - y0, x1 - x0, 3)
            assert np.abs(region.astype(np.int16) - full[y0:y1, x0:x1]).max() <= 1


@ROI
def test_pipeline_pixels_do_not_depend_on_region_decode(planner_reset):
    blobs = photo_jpegs((256, 512), 1, seed=5)[:8]
    # reduced_decode=False: no DCT scales nor fast upsampling, whose pixels differ.
    pipeline, dec = T.train(224, reduced_decode=False), get_decoder()
    outs = {}
    for region in (False, True):
        plan.set_planner(plan.Planner(costs.DEFAULT_COSTS, region=region))
        outs[region] = [pipeline.decode(b, dec, sample_rng(0, 0, i)) for i, b in enumerate(blobs)]
    headers = [read_header(b) for b in blobs]
    kinds = {plan.get_planner().choose(hd, pipeline.plan(hd.height, hd.width, sample_rng(0, 0, i)), False).kind
             for i, hd in enumerate(headers)}
    assert "region" in kinds
    for a, b in zip(outs[False], outs[True]):
        assert np.abs(a.astype(np.int16) - b).max() <= 1


def _pillow_crop_resize(data: bytes, crop: Crop) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        box = (crop.left, crop.top, crop.left + crop.width, crop.top + crop.height)
        return np.asarray(img.convert("RGB").crop(box).resize((crop.out_w, crop.out_h), Image.Resampling.BILINEAR))


def test_dct_scaled_plans_stay_within_the_antialiased_tolerance(planner_reset):
    """Against Pillow's antialiased resize of the full-size crop: mean <= 1.5, worst <= 5."""
    blobs = photo_jpegs((600, 1500), 2, seed=6)
    plan.set_planner(plan.Planner(costs.DEFAULT_COSTS, region=False))
    dec, diffs, scaled = get_decoder(), [], 0
    for i, data in enumerate(blobs):
        size = (96, 128, 160)[i % 3]
        pipeline = T.Compose([T.RandomResizedCrop(size, scale=(0.25, 1))])
        header = read_header(data)
        crop = pipeline.plan(header.height, header.width, sample_rng(0, 0, i))
        scaled += plan.get_planner().choose(header, crop).scale < 1
        out = pipeline.decode(data, dec, sample_rng(0, 0, i))
        diffs.append(np.abs(out.astype(np.int16) - _pillow_crop_resize(data, crop)).mean())
    diffs = np.array(diffs)
    assert scaled >= len(blobs) // 2, "too few DCT-scaled plans to test"
    assert diffs.mean() <= 1.5 and diffs.max() <= 5, (diffs.mean(), diffs.max())
    # Measured 0.49 / 1.19 (mean / worst image); cropping whole decoded pixels instead of
    # the exact phase: 1.48 / 4.48, at the tolerance's edge.
    assert diffs.mean() <= 0.8 and diffs.max() <= 2.5, (diffs.mean(), diffs.max())


def test_fast_upsampling_for_random_crops_only_and_within_tolerance(planner_reset):
    p = plan.Planner(costs.DEFAULT_COSTS, region=False)
    header = read_header(jpeg_bytes(make_image(10, 375, 500)))
    crop = Crop(50, 60, 250, 300, 224, 224)
    assert p.choose(header, crop).kind == "full, fast upsampling"
    assert p.choose(header, crop, scales=False).kind == "full"  # reduced_decode=False: a full decode's pixels
    assert p.choose(header, T.eval(224).plan(375, 500, None)).kind == "full"  # eval stays Pillow's to rounding
    blobs = photo_jpegs((256, 512), 1, seed=11)
    plan.set_planner(p)
    rrc, dec, diffs = T.RandomResizedCrop(224), get_decoder(), []
    for i, data in enumerate(blobs):
        hd = read_header(data)
        c = rrc.plan(hd.height, hd.width, sample_rng(0, 0, i))
        out = T.Compose([rrc]).decode(data, dec, sample_rng(0, 0, i))
        diffs.append(np.abs(out.astype(np.int16) - _pillow_crop_resize(data, c)).mean())
    # Measured on 250 real photos: 0.29 / 1.45 (mean / worst image); default upsampling 0.02 / 0.19.
    assert np.mean(diffs) <= 0.6 and np.max(diffs) <= 2.5, (np.mean(diffs), np.max(diffs))
    assert np.mean(diffs) > 0.05, "fast upsampling was not used"


def test_resize_box_is_pillows_box_resize():
    img = make_image(7, 300, 400)
    for top, left, height, width, out in ((10.5, 20.25, 203.4, 220.7, 100), (33.375, 17.875, 150.25, 165.25, 64),
                                          (0.5, 0.25, 120.0, 150.5, 80), (12, 30, 200, 240, 100)):
        assert phase_error(top, height / out) <= 1 / 16 and phase_error(left, width / out) <= 1 / 16
        got = resize_box(img, top, left, height, width, out, out).astype(np.int16)
        ref = np.asarray(Image.fromarray(img).resize((out, out), Image.Resampling.BILINEAR,
                                                     box=(left, top, left + width, top + height)))
        inner = np.abs(got - ref)[2:-2, 2:-2]  # edges: taps stop at the box's far side here
        assert inner.mean() < 0.5, (top, left, inner.mean())
    # A step of exactly 2 keeps a start of x.5 at x.5: no exact phase, and the planner avoids it.
    assert phase_error(10.5, 2.0) == 0.5


def test_crop_apply_takes_a_region_or_a_scale():
    img = make_image(8, 240, 320)
    crop = Crop(50, 60, 120, 150, 64, 64)
    whole = crop.apply(img, 240, 320)
    assert np.array_equal(crop.apply(img[40:200, 55:300], 240, 320, origin=(40, 55)), whole)
    half = np.asarray(Image.fromarray(img).resize((160, 120), Image.Resampling.BOX))
    assert np.abs(crop.apply(half, 240, 320, scale=0.5).astype(np.int16) - whole).mean() < 3


# --- calibration and its cache -----------------------------------------------------------


def test_calibration_fits_positive_costs_quickly():
    fitted = costs.calibrate(repeat=1, region=False, images=4)
    assert set(fitted["decode"]) == set(costs.DECODE_KEYS) and set(fitted["resize"]) == {"crop", "box", "window"}
    for c in [*fitted["decode"].values(), *fitted["resize"].values()]:
        assert all(v >= 0 for v in c) and sum(c) > 0
    assert fitted["backend"] in ("simplejpeg", "turbojpeg") and fitted["seconds"] < 10
    json.dumps(fitted)
    # A full decode of a 0.2-megapixel JPEG costs more than its 1/8-scale decode.
    p = plan.Planner(fitted, region=False)
    header = read_header(jpeg_bytes(make_image(0, 400, 500)))
    whole = Crop(0, 0, 400, 500, 224, 224)
    assert p.predict(header, whole, "full") > p.predict(header, whole, "1/8")


@ROI
def test_region_of_the_whole_image_is_never_predicted_cheaper_than_the_full_decode():
    fitted = costs.calibrate(repeat=1, images=4)
    assert all(r >= f for r, f in zip(fitted["decode"]["region"], fitted["decode"]["full"]))
    p = plan.Planner(fitted, region=True)
    header = read_header(jpeg_bytes(make_image(12, 400, 500)))
    assert p.choose(header, Crop(0, 0, 400, 500, 224, 224), scales=False).region is None


def test_costs_are_cached_per_key_and_calibrated_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(repeat=3, region=None, images=16):
        calls.append(1)
        return {**costs.DEFAULT_COSTS, "seconds": len(calls)}

    monkeypatch.setattr(costs, "calibrate", fake)
    assert costs.load_or_calibrate()["seconds"] == 1
    assert costs.load_or_calibrate()["seconds"] == 1 and len(calls) == 1  # from the file
    files = [f for f in os.listdir(tmp_path) if f.endswith(".json")]
    assert len(files) == 1 and json.load(open(tmp_path / files[0]))["key"]["cpu"]
    monkeypatch.setattr(costs, "cache_key", lambda: {"torch": "another version"})
    assert costs.load_or_calibrate()["seconds"] == 2  # new versions: calibrated again
    assert costs.load_or_calibrate(redo=True)["seconds"] == 3


def test_no_calibration_and_unwritable_cache_use_the_built_in_costs(tmp_path, monkeypatch, planner_reset):
    monkeypatch.setattr(costs, "calibrate", lambda *a, **k: pytest.fail("calibrated"))
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    plan.set_planner(None)
    assert plan.get_planner().costs is costs.DEFAULT_COSTS
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(blocked / "sub"))  # cannot be made
    with pytest.warns(RuntimeWarning, match="DEFAULT_COSTS"):
        assert costs.load_or_calibrate() is costs.DEFAULT_COSTS


@pytest.mark.slow  # 4-8 s: make test stays under 4 minutes (make test-slow runs it)
def test_processes_started_together_share_one_calibration(tmp_path):
    """The plan, and so the pixels, of a sample must not depend on which process decoded it."""
    code = ("import functools, json; from fastload.decode import costs, plan; "
            "costs.calibrate = functools.partial(costs.calibrate, repeat=1, images=3); "  # a short one
            "print(json.dumps(plan.get_planner().costs, sort_keys=True))")
    env = {**os.environ, "FASTLOAD_CACHE_DIR": str(tmp_path), "PYTHONPATH": ROOT}
    env.pop("FASTLOAD_NO_CALIBRATION", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1 and json.loads(outs[0])["decode"]


# --- the optional extra -------------------------------------------------------------------


def test_missing_nvimgcodec_names_the_extra(monkeypatch, nvimgcodec_regions):
    import builtins

    real = builtins.__import__

    def no_nvidia(name, *args, **kwargs):
        if name.startswith("nvidia"):
            raise ImportError("No module named 'nvidia'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nvidia)
    monkeypatch.setattr(roi, "_module", None)
    monkeypatch.setattr(roi, "_failed", None)
    monkeypatch.setattr(roi, "_decoder", None)
    assert not roi.available()
    with pytest.raises(ImportError, match=r"pip install 'fastload\[roi\]'"):
        roi.get_region_decoder()


def test_fastload_roi_0_turns_region_decode_off(monkeypatch):
    monkeypatch.setenv("FASTLOAD_ROI", "0")
    assert not roi.available()


@ROI
def test_import_drops_nvimgcodecs_missing_gpu_library_lines():
    code = "from fastload.decode import roi; roi.module(); import sys; print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout
    assert "nvjpeg" not in proc.stderr.lower() and "ERROR" not in proc.stderr, proc.stderr


# --- per-sample overhead ------------------------------------------------------------------


@pytest.mark.decoder("turbojpeg")
def test_turbojpeg_keeps_one_handle_per_thread():
    dec = get_decoder("turbojpeg")
    mine = dec._handle()
    assert dec._handle() is mine
    other = []
    t = threading.Thread(target=lambda: other.append(dec._handle()))
    t.start()
    t.join()
    assert other[0] is not mine and other[0].ptr != mine.ptr


def test_random_resized_crop_draws_once_per_try():
    class Counting:
        def __init__(self, seed):
            self.rng, self.calls = np.random.default_rng(seed), 0

        def __getattr__(self, name):
            self.calls += 1
            return getattr(self.rng, name)

    counts = []
    for seed in range(50):
        rng = Counting(seed)
        T.RandomResizedCrop(224).plan(375, 500, rng)
        counts.append(rng.calls)
    assert min(counts) == 1 and max(counts) <= 10


def test_warnings_free_planning(planner_reset):
    plan.set_planner(plan.Planner(costs.DEFAULT_COSTS, region=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        T.train(64).decode(jpeg_bytes(make_image(9, 200, 260)), get_decoder(), sample_rng(0, 0, 1))


def test_the_planner_follows_the_cache_the_environment_names(monkeypatch, tmp_path):
    """A process whose environment names another cache (a test's XDG_CACHE_HOME, a user's
    FASTLOAD_CACHE_DIR) plans from that one, as a process started with it would."""
    from fastload.decode import plan

    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "a"))
    first = plan.get_planner()
    assert plan.get_planner() is first  # built once while nothing changes
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "b"))
    assert plan.get_planner() is not first
    monkeypatch.delenv("FASTLOAD_CACHE_DIR")
    plan.set_planner(None)
