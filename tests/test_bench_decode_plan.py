"""benchmarks/bench_decode_plan.py --quick runs, prints its ratios and reports JSON."""

import json
import os
import subprocess
import sys

from fastload.decode import roi

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_decode_plan.py")


def test_quick_mode_runs_and_reports(tmp_path):
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "FASTLOAD_NO_CALIBRATION": "1"}
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--data", str(tmp_path / "data"), "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "x full decode + resize" in proc.stdout and "of the full-decode limit" in proc.stdout
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["benchmark"] == "bench_decode_plan" and record["quick"] is True
    planners = ["no region", "region"] if roi.available() else ["no region"]
    assert list(record["plans"]) == planners and list(record["loader_images_per_s"]) == planners
    assert all(rate > 0 for rate in record["loader_images_per_s"].values())
    assert "pipeline, planner (no region)" in record["pipeline_vs_reference"]
    assert record["decode_us"]["full decode"] > 0 and "DCT scale 1/2" in record["decode_us"]
    if roi.available():
        assert "region decode of the crop" in record["decode_us"] and record["plans"]["region"].get("region", 0) > 0
