"""Every benchmark's --quick mode runs, so none of them can rot."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(HERE), "benchmarks")
sys.path.insert(0, BENCH)
from run_all import BENCHMARKS  # noqa: E402


# tests/test_bench_<name>.py check their output (test_bench_wds.py: bench_wds and wds_shuffle)
OWN_TESTS = ("bench_resize", "bench_decode_plan", "bench_wds", "wds_shuffle")
SLOW = ("bench_spawn_start",)  # spawned workers: most of a minute even in --quick mode


@pytest.mark.parametrize("entry", [pytest.param(e, marks=pytest.mark.slow) if e.split()[0] in SLOW else e
                                   for e in BENCHMARKS if e.split()[0] not in OWN_TESTS])
def test_quick_mode_runs_and_reports(entry, tmp_path):
    name, *own = entry.split()
    out = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(BENCH, f"{name}.py"), *own, "--quick", "--json", str(out),
                           "--data", str(tmp_path / "data")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip(), "a benchmark must print its figures"
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["benchmark"] == name and record["quick"] is True
