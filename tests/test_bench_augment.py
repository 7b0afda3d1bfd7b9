"""benchmarks/bench_augment.py --quick runs, prints a row per transform with the ratio and
reports JSON."""

import json
import os
import subprocess
import sys

import pytest

from fastload.photos.bundled import photo_dir

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_augment.py")


def test_quick_mode_runs_and_reports(tmp_path):
    try:
        photo_dir()
    except ImportError as e:  # scikit-image's photographs are the benchmark's data
        pytest.skip(str(e))
    out = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["benchmark"] == "bench_augment" and record["quick"] is True
    names = [r["transform"] for r in record["rows"]]
    assert names == ["RandAugment(2, 9)", "TrivialAugmentWide()", "ColorJitter(0.4, 0.4, 0.4)",
                     "AutoAugment(IMAGENET)", "AugMix()"]
    for row in record["rows"]:
        assert row["transform"] in proc.stdout and row["fastload_us"] > 0
        if row["torchvision_us"] is not None:  # torchvision is a test-only peer
            assert row["ratio"] > 0 and row["wall_ratio"] > 0 and f"{row['ratio']:.2f}x" in proc.stdout
