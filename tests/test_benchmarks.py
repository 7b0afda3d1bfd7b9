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

# tests/test_bench_<name>.py check their output (test_bench_wds.py: bench_wds and wds_shuffle);
# bench_handoff_peers: its own test below
OWN_TESTS = ("bench_resize", "bench_decode_plan", "bench_wds", "wds_shuffle", "bench_augment", "bench_handoff_peers")
SLOW = (
    "bench_spawn_start",  # spawned workers: most of a minute even in --quick mode
    "bench_loader",  # every peer and switch: about 20 s in --quick mode
    "bench_recipe",  # timm's create_loader beside fastload: about 10 s
    # Over 9 s each on the busy 2-core machine (make test's budget is 4 minutes):
    "bench_memory",  # USS of workers over several epochs: 18 s
    "bench_gpu_decode",  # both parts of the GPU step's dry run, timm's loader included: 11 s
    "bench_gpu_train",  # four feeds and two models in the dry run: 9 s
    "bench_wrap",  # a user's dataset wrapped, every backend: 9 s
    "bench_multiview",  # DINO's multi-crop against its reference: 9 s
    # 4-6 s each on the quiet machine (make test took 243 s there with them):
    "bench_pip_only", "bench_sample", "bench_handoff", "bench_decode",
    "bench_gpu_rows",  # the row kernel in Triton's interpreter: 4 s
    "profile_loader",  # with --stages 7 s, without 3 s (make test took 242 s with them)
    "bench_region_decode",  # four 2-8 MP photos made, then every region path: about 15 s
    "bench_checksum",  # four 2-8 MP photos and 48 small ones made, then three paths each: about 8 s
    "bench_tune_choice",  # fastload tune as a subprocess, then its choice re-measured: about 15 s
    "bench_ceiling",  # 48 photos made, then decoded and resized 8 times: about 5 s
)  # make test-slow (.ci/run) runs them


@pytest.mark.parametrize("entry", [pytest.param(e, marks=pytest.mark.slow) if e.split()[0] in SLOW else e
                                   for e in BENCHMARKS if e.split()[0] not in OWN_TESTS])
def test_quick_mode_runs_and_reports(entry, tmp_path):
    run_quick(entry, tmp_path)


def run_quick(entry: str, tmp_path) -> tuple[str, dict]:
    """``entry``'s --quick mode (a script and its own arguments): its printed output and its JSON record."""
    name, *own = entry.split()
    out = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(BENCH, f"{name}.py"), *own, "--quick", "--json", str(out),
                           "--data", str(tmp_path / "data")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip(), "a benchmark must print its figures"
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["benchmark"] == name and record["quick"] is True
    return proc.stdout, record


@pytest.mark.slow  # two photo sets, six fastload loaders and the peers: about a minute
def test_handoff_peers_names_every_peer_and_target(tmp_path):
    from bench_handoff_peers import DALI, DEFAULT, LIMIT, SPDL, TARGETS, TIMM

    stdout, record = run_quick("bench_handoff_peers", tmp_path)
    for key in ("photos", "large"):
        result = record["sets"][key]
        rows, skipped = result["medians"]["wall"], result["skipped"]
        # A peer is measured, or named as not run with the reason (never silently left out).
        for peer in (TIMM, DALI, SPDL, "FFCV"):
            measured = [r for r in rows if r.startswith(peer)]
            reasons = [why for name, why in skipped.items() if name.startswith(peer)]
            assert bool(measured) != bool(reasons), (key, peer, list(rows), skipped)
            assert all(why.strip() for why in reasons)
            for why in reasons:
                assert why in stdout
        assert rows[DEFAULT]["first"] and rows[DEFAULT]["later"] and rows[LIMIT]["later"]
        # Every target of the set has its line: a ratio where the row ran, 'not run' where not.
        for how in ("wall", "steady", "cpu"):
            targets = result["targets"][how]
            assert targets["first / later"] is not None
            for row in TARGETS[key]:
                if row == LIMIT:
                    assert all(v is not None for v in targets["share of the full-decode limit"]), targets
                elif any(r.startswith(row) for r in rows):
                    assert any(label.startswith(row) for label in targets), (row, targets)


def test_handoff_peers_names_ffcv_as_not_run_with_the_reason(tmp_path):
    """FFCV runs in its own venv (make bench-ffcv): without it, its row is named as not run and why."""
    from argparse import Namespace

    from bench_handoff_peers import pipelines

    from fastload.photos.jpegs import make_photo_dataset

    root = make_photo_dataset(str(tmp_path / "photos"), num_images=4, num_classes=2)
    paths = sorted(str(p) for p in (tmp_path / "photos").rglob("*.jpg"))
    missing = str(tmp_path / "no-venv" / "bin" / "python")
    rows, skipped = pipelines(root, paths, 2, 2, Namespace(no_dali=True, ffcv_python=missing))
    assert not [r for r in rows if r.startswith("FFCV")]
    why = skipped["FFCV 1.0.2"]
    assert f"FFCV's interpreter {missing} does not exist" in why and "make bench-ffcv" in why
    # An interpreter without FFCV (fastload's own): the import error is the reason.
    rows, skipped = pipelines(root, paths, 2, 2, Namespace(no_dali=True, ffcv_python=sys.executable))
    assert not [r for r in rows if r.startswith("FFCV")]
    assert f"FFCV does not import in {sys.executable}: ModuleNotFoundError: No module named 'ffcv'" in skipped[
        "FFCV 1.0.2"]
    assert not list(tmp_path.glob("*.beton"))


def test_train_step_timing_splits_data_wait_from_compute():
    import time

    import torch
    from bench_gpu_train import run_steps

    class Slow(torch.nn.Module):
        def __init__(self, seconds):
            super().__init__()
            self.seconds, self.fc = seconds, torch.nn.Linear(3, 10)

        def forward(self, x):
            time.sleep(self.seconds)
            return self.fc(x.float().mean((2, 3)))

    def batches(seconds):
        while True:
            time.sleep(seconds)
            yield torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.int64)

    cpu = torch.device("cpu")
    starved = run_steps(batches(0.06), Slow(0.0), cpu, warmup=1, steps=4)
    fed = run_steps(batches(0.0), Slow(0.06), cpu, warmup=1, steps=4)
    # The wait is the time from the end of one step to the batch of the next being ready.
    assert starved["wait_ms"] >= 55 and fed["wait_ms"] < 30 <= fed["step_ms"] - 30, (starved, fed)
    assert starved["wait_share"] > fed["wait_share"] and starved["steps"] == fed["steps"] == 4
    assert abs(fed["images_per_s"] - 2 / (fed["step_ms"] / 1e3)) < 0.5 * fed["images_per_s"]


@pytest.mark.slow
def test_old_new_comparison_runs_against_a_checkout(tmp_path):
    """bench_old_new.py's --quick mode, the tree compared with itself (a checkout of the old
    code is the user's to make): each version's process runs its own fastload."""
    out = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "bench_old_new.py"), "--old", os.path.dirname(BENCH),
                           "--quick", "--workers", "1", "--json", str(out), "--data", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("new/old") == 18  # 3 cases x train/eval x wall, CPU and first batch
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["benchmark"] == "bench_old_new" and len(record["runs"]["train"]) == 6


@pytest.mark.slow  # spinning processes beside one calibration per install or mode, then the runs: 15-25 s each
@pytest.mark.parametrize("entry", ["bench_pip_only --busy-calibration", "bench_loader --switches --busy-calibration"])
def test_a_calibration_made_on_a_busy_machine_is_recognised_and_not_planned_with(entry, tmp_path):
    out, _ = run_quick(entry, tmp_path)
    made = [line for line in out.splitlines() if line.startswith("calibration on a busy machine")]
    assert len(made) == 2, out  # both installs, or both modes
    for line in made:
        assert "noisy True" in line and "planners use the built-in costs (untrusted)" in line, line
    if entry.startswith("bench_loader"):
        assert "the default calibrated on a busy machine against each switch" in out
