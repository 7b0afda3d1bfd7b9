"""benchmarks/gpu_decode_probe.py (the GPU decode ceiling) in its dry run: the CPU backend, tiny."""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import photo_jpegs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("nvidia.nvimgcodec")


def test_the_probe_dry_run_writes_a_json_line_per_measurement_and_its_table(tmp_path):
    photos = tmp_path / "photos" / "a"
    photos.mkdir(parents=True)
    for i, data in enumerate(photo_jpegs((120, 200), 1, seed=2)[:8]):
        (photos / f"{i}.jpg").write_bytes(data)
    out = tmp_path / "probe.jsonl"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_decode_probe.py"), "--dry-run",
                           "--photos", str(tmp_path / "photos"), "--json", str(out), "--budget", "30"],
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["benchmark"] == "gpu_decode_probe" for r in records)
    setup = records[0]["setup"]
    assert setup["images"] == 8 and setup["batch"] == 4 and "nvimgcodec" in setup and "nvjpeg_path" in setup
    measured = {r["config"]: r for r in records[1:]}
    assert len(measured) == len(records) - 1 >= 15
    assert not [r for r in measured.values() if "error" in r or "skipped" in r], measured
    # Every factor the probe varies is there, each measured >= 3 times.
    for key, values in {"backends": {"hw", "cuda", "hybrid", "all"}, "fancy": {True, False},
                        "regions": {"whole", "region", "plain", "padded"}, "threads": {1, 2, 4},
                        "cpu_threads": {0, 4}, "prealloc": {True, False}}.items():
        assert {r[key] for r in measured.values()} == values, key
    for r in measured.values():
        ips = r["images_per_s"]
        assert r["repeats"] >= 3 and 0 < ips["min"] <= ips["median"] <= ips["max"], r
        if r["regions"] != "whole":  # libjpeg-turbo: every region cut is the whole decode's
            assert r["exact"]["rows"] > 0 and r["exact"]["max_diff"] == 0, r
    assert "gpu_decode_probe: images/s" in proc.stdout and "all/padded/fancy1/t1/cpu4/prealloc" in proc.stdout
    assert took < 20, took  # about 3 s here


def test_probe_regions_are_random_resized_crops_under_half_the_image():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import gpu_decode_probe
    import numpy as np

    rng = np.random.default_rng(0)
    boxes = [gpu_decode_probe.rrc_region(rng, 300, 400) for _ in range(200)]
    regions = [b for b in boxes if b is not None]
    assert 50 < len(regions) < 200
    for y0, x0, y1, x1 in regions:
        assert 0 <= y0 < y1 <= 300 and 0 <= x0 < x1 <= 400 and (y1 - y0) * (x1 - x0) < 0.5 * 300 * 400
    with pytest.raises(FileNotFoundError, match="no libnvjpeg.so. under --nvjpeg-site"):
        gpu_decode_probe.preload_nvjpeg(os.path.join(ROOT, "docs"))
