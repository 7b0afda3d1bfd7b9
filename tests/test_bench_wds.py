"""benchmarks/wds_shuffle.py measures what the README says of the WebDataset shuffle, and
benchmarks/bench_wds.py's --quick mode runs (slow: it starts a server and 4 loaders)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(HERE), "benchmarks")
sys.path.insert(0, BENCH)
import wds_shuffle  # noqa: E402


def test_the_window_shuffle_is_close_to_a_global_one():
    counts = np.full(64, 400, np.int64)  # 25,600 samples, 2 ranks × 4 workers, batch 64
    shard_of = np.repeat(np.arange(64), counts)
    classes = np.arange(len(shard_of)) * 100 // len(shard_of)
    a, b = (wds_shuffle.window_order(counts, 2, 4, 64, 4, e) for e in (0, 1))
    assert sorted(set(a.tolist())) == list(range(len(shard_of)))
    got = wds_shuffle.measures(a, b, shard_of, classes, 64, 4)
    assert abs(got["spearman_vs_storage"]) < 0.15
    assert abs(got["mean_displacement"] - 1 / 3) < 0.03
    assert abs(got["epoch_to_epoch"]) < 0.2  # a new order every epoch
    assert got["batches_within_window"] > 0.95 and got["shards_per_batch"] > 3  # mixed within windows of 4 shards
    rng = np.random.default_rng(0)
    ideal = wds_shuffle.measures(rng.permutation(len(shard_of)), rng.permutation(len(shard_of)), shard_of, classes,
                                 64, 1)
    assert abs(ideal["mean_displacement"] - 1 / 3) < 0.01 and abs(ideal["epoch_to_epoch"]) < 0.05


@pytest.mark.slow
def test_bench_wds_quick_mode_runs_and_reports(tmp_path):
    out = tmp_path / "results.jsonl"
    for name in ("bench_wds", "wds_shuffle"):
        proc = subprocess.run([sys.executable, os.path.join(BENCH, f"{name}.py"), "--quick", "--json", str(out)]
                              + (["--data", str(tmp_path / "data")] if name == "bench_wds" else []),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        if name == "bench_wds":
            assert "fastload HTTP / fastload disk:" in proc.stdout and "webdataset, HTTP" in proc.stdout
        else:
            assert "fastload, window 4" in proc.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["benchmark"] for r in records] == ["bench_wds", "wds_shuffle"] and all(r["quick"] for r in records)
