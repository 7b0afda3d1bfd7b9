"""benchmarks/bench_decode_plan.py --quick runs, prints its audit and reports JSON."""

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
    assert "predicted/measured" in proc.stdout and "oracle (fastest plan per sample)" in proc.stdout
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["benchmark"] == "bench_decode_plan" and record["quick"] is True and not record["calibrated"]
    for mode in ("train", "eval"):
        result = record["results"][mode]
        assert set(result["policy_mean_us"]) == {"default", "FASTLOAD_ROI=trusted", "reduced_decode=False",
                                                 "FASTLOAD_NO_CALIBRATION=1", "full decode only",
                                                 "oracle (fastest plan per sample)"}
        assert result["default_vs"]["default"] == 1 and result["per_plan"]["full"]["samples"] == 32
        assert all(v > 0 for v in result["policy_mean_us"].values())
    train = record["results"]["train"]
    assert "fast" in train["per_plan"] and ("region" in train["per_plan"]) == roi.available()
    assert "fast" not in record["results"]["eval"]["per_plan"]  # eval windows: no fast upsampling
