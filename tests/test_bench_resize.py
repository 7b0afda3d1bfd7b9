"""benchmarks/bench_resize.py --quick runs, prints its table and reports JSON."""

import json
import os
import subprocess
import sys

import pytest

from fastload.photos.bundled import photo_dir

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_resize.py")


@pytest.mark.slow  # 4-8 s: make test stays under 4 minutes (make test-slow runs it)
def test_quick_mode_runs_and_reports(tmp_path):
    try:
        photo_dir()
    except ImportError as e:  # scikit-image's photographs are the benchmark's data
        pytest.skip(str(e))
    out = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "fastload resize_window (exact; eval)" in proc.stdout
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["benchmark"] == "bench_resize" and record["quick"] is True
    eval_row = next(r for r in record["rows"] if r["candidate"] == "eval preset (antialias, default)")
    assert eval_row["mean"] <= 1.5 and eval_row["worst"] <= 5
