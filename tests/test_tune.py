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


def test_list_file_with_root_and_best_is_a_loader_config(folder, tmp_path, capsys, monkeypatch):
    import os

    import fastload.tune

    seeds, measure = [], fastload.tune.measure_loader
    monkeypatch.setattr(fastload.tune, "measure_loader", lambda ds, cfg, *a: seeds.append(cfg.seed) or measure(ds, cfg, *a))

    lines = [f"{os.path.relpath(os.path.join(d, f), folder)} {i}"
             for i, d in enumerate(sorted(os.path.join(folder, c) for c in os.listdir(folder))) for f in os.listdir(d)]
    listing = tmp_path / "train.txt"  # elsewhere than the images: paths resolve against --root
    listing.write_text("\n".join(lines) + "\n")
    out = tmp_path / "tune.json"
    rc = main(["tune", str(listing), "--root", folder, "--batch-sizes", "8", "--workers", "1", "--backends",
               "process", "--seconds", "0.2", "--size", "32", "--grid", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "measured 1 of 1 configurations (grid search) and the baseline" in text
    report = json.loads(out.read_text())
    assert report["dataset"]["samples"] == 24 and report["measured"] == 1 and report["grid_size"] == 1
    cfg = fl.LoaderConfig(**report["best"])
    assert (cfg.batch_size, cfg.num_workers, cfg.backend) == (8, 1, "process")
    assert report["best_samples_per_s"] > 0
    assert seeds == [0, 0], "every candidate (and the baseline) reads the same samples in the same order"
    assert report["config"]["seed"] is None, "a Loader made from the reported config draws its own seed"


@pytest.mark.parametrize("args,message", [
    (["--json", "/nonexistent/dir/t.json"], "--json /nonexistent/dir/t.json: folder /nonexistent/dir does not exist"),
    (["--plot", "/nonexistent/t.png"], "--plot /nonexistent/t.png: folder /nonexistent does not exist"),
    (["--json", "{tmp}"], "is a folder; give a file name"),
    (["--root", "{tmp}"], "--root applies to list files"),
])
def test_bad_paths_fail_before_measuring(folder, tmp_path, monkeypatch, capsys, args, message):
    import fastload.tune as tune

    monkeypatch.setattr(tune, "run", lambda *a, **k: pytest.fail("measured before checking the paths"))
    monkeypatch.setattr(tune, "measure_loader", lambda *a, **k: pytest.fail("measured"))
    rc = main(["tune", folder, *[a.format(tmp=tmp_path) for a in args]])
    assert rc == 2 and message in capsys.readouterr().err


def test_every_option_has_help():
    import argparse

    from fastload.tune import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    tune = parser._subparsers._group_actions[0].choices["tune"]
    missing = [a.dest for a in tune._actions if not a.help]
    assert not missing, missing


def test_plot_ticks_are_whole_workers():
    pytest.importorskip("matplotlib")
    from fastload.tune import figure

    report = {"measurements": [{"batch_size": 64, "backend": "process", "num_workers": w, "samples_per_s": 100 + w}
                               for w in (0, 1, 2)],
              "dataset": {"type": "ImageFolder"}, "machine": {"cpu": "test"}}
    ax = figure(report).axes[0]
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
