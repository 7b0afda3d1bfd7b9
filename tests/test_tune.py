import json
import math
import subprocess
import sys

import pytest

import fastload as fl
from fastload.cli import main
from fastload.tune import worker_candidates
from fastload.tune.search import Searcher, Space, adaptive_search, grid_search

SPACE = dict(batch_sizes=[64, 128, 256], workers=[0, 1, 2, 4, 6, 8, 12, 16], prefetch=[2, 4],
             backends=["process", "thread"], pin=[False])


def plateau(c):
    """Scales with workers up to 6 cores, then flat; bigger batches help a little."""
    return 100 * min(max(c["num_workers"], 0.7), 6) * (1 + 0.02 * math.log2(c["batch_size"] / 64)) \
        * (1.03 if c["prefetch_factor"] == 4 else 1) * (1.15 if c["backend"] == "thread" else 1)


def peaked(c):
    """Oversubscription: best at 8 workers, worse beyond; batch 128 is the sweet spot."""
    w = c["num_workers"]
    base = 90 * w - 4 * max(0, w - 8) ** 2 if w else 50
    return base * {64: 0.9, 128: 1.0, 256: 0.95}[c["batch_size"]] * (1.1 if c["backend"] == "process" else 1)


def slow_start(c):
    """One worker is slower than none (main-process overhead), then it scales to 12."""
    w = c["num_workers"]
    return (300 if w == 0 else 200 * min(w, 12) ** 0.9) * (1.08 if c["prefetch_factor"] == 4 else 1)


@pytest.mark.parametrize("surface", [plateau, peaked, slow_start])
def test_adaptive_finds_the_optimum_cheaply(surface):
    space = Space(**SPACE)
    grid = Searcher(surface)
    _, best = grid_search(space, grid)
    adaptive = Searcher(surface)
    _, found = adaptive_search(space, adaptive)
    assert found >= 0.95 * best, (found, best)
    assert len(adaptive.results) <= 0.4 * len(grid.results), (len(adaptive.results), len(grid.results))


def test_grid_skips_thread_backend_without_threads():
    grid = Space(**SPACE).grid()
    assert not any(c["backend"] == "thread" and c["num_workers"] == 0 for c in grid)
    assert len(grid) == 3 * 8 * 2 * 2 - 3 * 2


def test_space_rejects_bad_values():
    with pytest.raises(ValueError, match="batch sizes must be >= 1"):
        Space(batch_sizes=[0], workers=[1])
    with pytest.raises(ValueError, match="no candidate values for batch_size"):
        Space(batch_sizes=[], workers=[1])


def test_worker_candidates_stop_at_available_cpus():
    assert worker_candidates(2) == [0, 1, 2]
    assert worker_candidates(8) == [0, 1, 2, 4, 6, 8]
    assert worker_candidates(5) == [0, 1, 2, 4, 5]


def test_cli_small_grid_writes_json_and_saves_profile(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "tune.json"
    rc = main(["tune", folder, "--batch-sizes", "8", "--workers", "0,1", "--backends", "process",
               "--seconds", "0.3", "--size", "32", "--grid", "--json", str(out), "--save-profile"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "* best:" in text and "bottleneck:" in text
    report = json.loads(out.read_text())
    assert report["grid_size"] == 2 and {m["num_workers"] for m in report["measurements"]} == {0, 1}
    for m in report["measurements"]:
        assert m["samples_per_s"] > 0 and m["peak_pss"] > 0 and len(m["windows"]) == 3
    assert report["dataset"]["samples"] == 24 and report["machine"]["cpus"] >= 1
    assert report["bottleneck"]["bound_by"] in ("storage", "decode+transform", "collate+transfer")
    chosen = report["best"]["num_workers"]
    loader = fl.Loader(fl.ImageFolder(folder), num_workers="auto", device="cpu")
    assert loader.num_workers == chosen and loader.profile["config"]["num_workers"] == chosen
    loader.close()


@pytest.mark.parametrize("args,message", [
    (["tune", "/nonexistent/data"], "does not exist"),
    (["tune", "{folder}", "--batch-sizes", "0"], "batch sizes must be >= 1"),
    (["tune", "{folder}", "--backends", "gpu"], "unknown backend"),
    (["tune", "{folder}", "--seconds", "0"], "--seconds must be positive"),
])
def test_cli_bad_arguments_are_clear_errors(folder, capsys, args, message):
    rc = main([a.format(folder=folder) for a in args])
    assert rc == 2 and message in capsys.readouterr().err


def test_cli_empty_list_is_rejected_by_the_parser(folder):
    proc = subprocess.run([sys.executable, "-m", "fastload.cli", "tune", folder, "--workers", ","],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--workers is empty" in proc.stderr


def test_plot_writes_png_or_says_what_to_install(folder, tmp_path, capsys):
    png = tmp_path / "t.png"
    rc = main(["tune", folder, "--batch-sizes", "8", "--workers", "0", "--backends", "process",
               "--seconds", "0.2", "--size", "32", "--plot", str(png)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert rc == 2 and "pip install 'fastload[plot]'" in capsys.readouterr().err
        assert not png.exists()
    else:
        assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
