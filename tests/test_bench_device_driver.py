"""benchmarks/bench_device_driver.py runs, and finds a tree's batches identical to its own."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # two child processes importing torch: about 6 s idle, half a minute under load
def test_quick_mode_compares_two_trees(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "bench_device_driver.py")
    proc = subprocess.run([sys.executable, script, "--quick", "--old", ROOT, "--data", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if "old/new" in line]
    assert len(rows) == 1 and all("batches identical" in row for row in rows), proc.stdout
