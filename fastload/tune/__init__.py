"""``fastload tune``: measure workers × batch size × settings on this machine and dataset."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import IO, Any

import torch
from tqdm import tqdm

from .. import transforms
from ..config import LoaderConfig
from ..datasets.protocols import Summarized, is_stream
from ..system import cpu_model, cpus_per_rank
from .dataset import check_root, open_tuned, short_batches, small_dataset_warning, stream_refusal
from .decide import decide, key
from .files import check_output, write_output
from .measure import MIN_WINDOW_BATCHES, bottleneck, measure_loader
from .noise import dips, leaders, runoff
from .options import add_arguments, command_line
from .profile import forget, save_profile, slower_than_default
from .report import figure, plot, print_table
from .search import Searcher, Space, adaptive_search, grid_search

__all__ = [
    "Interrupted",
    "Space",
    "adaptive_search",
    "build_args",
    "command_line",
    "figure",
    "grid_search",
    "main",
    "plot",
    "print_table",
    "run",
    "worker_candidates",
]

#: The clock ``--budget`` is kept by (a fake one in tests).
clock = time.perf_counter


def worker_candidates(cpus: int | None = None) -> list[int]:
    """0, 1, 2, 4, 6, ... up to the CPUs this process (rank) may use."""
    cpus = cpus or cpus_per_rank()
    return sorted({0, 1, cpus, *range(2, cpus + 1, 2)})


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tune",
        help="find the fastest loader settings for this machine and dataset",
        description="Measure loader configurations on DATASET and report the fastest.",
    )
    add_arguments(p)
    p.set_defaults(func=main)


def build_args(argv: list[str]) -> argparse.Namespace:
    """The namespace ``fastload tune ARGV`` would get (for calling :func:`run` from code)."""
    parser = argparse.ArgumentParser(prog="fastload")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["tune", *argv])


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while measuring; ``report`` holds the measurements made before it (``"interrupted": True``).
    A KeyboardInterrupt still, for callers of :func:`run` that do not look for the report."""

    def __init__(self, report: dict) -> None:
        super().__init__(f"interrupted after {report['measured']} configurations")
        self.report = report


def _rows(configs: list[dict], details: dict, runs: dict) -> list[dict]:
    """The report's ``measurements``: each configuration's first run in detail, and the median of its runs."""
    return [
        {
            **c,
            **details[key(c)],
            "first_run": details[key(c)]["samples_per_s"],
            "samples_per_s": statistics.median(runs[key(c)]),
            "runs": list(runs[key(c)]),
        }
        for c in configs
    ]


def _machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cpus": cpus_per_rank(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def run(args: argparse.Namespace, progress: bool = True) -> dict:
    """Runs the search described by ``args`` (the CLI's namespace); returns the JSON report.

    Raises:
        ValueError: A bad argument, a dataset the tuner cannot measure, or ``--save-profile``
            on a dataset too small for any batch size tried.
        Interrupted: Ctrl-C while measuring, with the measurements made before it.
    """
    if args.seconds <= 0:
        raise ValueError(f"--seconds must be positive, got {args.seconds}")
    if args.repeats < 2:
        raise ValueError(f"--repeats must be >= 2 (one run cannot show its noise), got {args.repeats}")
    if args.budget < 0:
        raise ValueError(f"--budget must be >= 0 seconds, got {args.budget}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    if args.model and device != "cuda":
        raise ValueError("--model needs --device cuda")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - {"process", "thread"})
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; choose from process, thread")
    pin = [args.pin if args.pin is not None else device == "cuda"]
    space = Space(
        args.batch_sizes,
        args.workers if args.workers is not None else worker_candidates(),
        args.prefetch,
        backends,
        pin,
    )
    tf = transforms.train(args.size) if args.transform == "train" else transforms.eval(args.size)
    dataset = open_tuned(args, tf)
    if is_stream(dataset):
        raise ValueError(stream_refusal(args.dataset, dataset))
    warnings = []
    short = short_batches(len(dataset), space.values["batch_size"])
    if short:
        warnings.append(small_dataset_warning(args.dataset, len(dataset), short))
        if args.save_profile and len(short) == len(space.values["batch_size"]):
            raise ValueError(f"--save-profile refused before measuring: {warnings[0]}")
        print(f"fastload tune: warning: {warnings[0]}", file=sys.stderr)
    grid = space.grid()
    bar = tqdm(total=len(grid), desc="tuning", unit="config", disable=None if progress else True)

    def to_config(c: dict) -> LoaderConfig:
        # One seed for all candidates: each reads the same samples in the same order.
        return LoaderConfig(device=device, shuffle=True, seed=0, **c)

    details: dict = {}  # the first run's CPU use and memory, by configuration
    runs: dict[tuple, list[float]] = {}  # every run's samples/s, by configuration

    def measure(c: dict) -> float:
        res = measure_loader(dataset, to_config(c), args.seconds)
        details.setdefault(key(c), res)
        runs.setdefault(key(c), []).append(res["samples_per_s"])
        return res["samples_per_s"]

    def tick(c: dict, rate: float) -> None:
        bar.update(1)
        bar.set_postfix_str(f"bs={c['batch_size']} w={c['num_workers']} {c['backend']}: {rate:.0f}/s")

    def remeasure(c: dict) -> float:
        if bar.n >= bar.total:
            bar.total += 1  # rounds go on while the budget allows: their number is not known ahead
        rate = measure(c)
        tick(c, rate)
        return rate

    searcher = Searcher(measure, tick)
    start = time.perf_counter()
    summary = dataset.summary() if isinstance(dataset, Summarized) else {"path": args.dataset}
    try:
        best, _ = (grid_search if args.grid else adaptive_search)(space, searcher)
        # PyTorch's default: no workers, at the batch size the search chose.
        baseline = {**best, "num_workers": 0, "backend": "process"}
        searcher(baseline)
        in_grid = [(c, r) for c, r in searcher.results if c in grid]  # the baseline may lie outside the grid
        # The finalists come from the best few profiles run twice (in opposite orders), not from one run each.
        contenders = runoff(in_grid, remeasure)
        decision = decide(
            leaders(contenders),
            remeasure,
            baseline=baseline,
            min_rounds=(args.repeats + 1) // 2,
            budget_s=args.budget,
            clock=clock,
        )
        bar.close()
        best = decision.chosen
        best_rate = statistics.median(runs[key(best)])
        verdict = bottleneck(dataset, to_config(best), best_rate, max(1.0, args.seconds / 2))
        if args.model:
            from .model import model_step

            model = model_step(args.model, args.size, space.values["batch_size"], best_rate)
    except KeyboardInterrupt:
        bar.close()
        done = [c for c, _ in searcher.results if key(c) in runs]  # a run cut short has no figure
        raise Interrupted(
            {
                "interrupted": True,
                "machine": _machine(),
                "dataset": summary,
                "search": "grid" if args.grid else "adaptive",
                "seconds_per_config": args.seconds,
                "measured": len(done),
                "grid_size": len(grid),
                "elapsed_s": time.perf_counter() - start,
                "measurements": _rows(done, details, runs),
                "best": None,
                "warnings": warnings,
            }
        ) from None

    def rate_of(c: dict) -> float:  # the one figure each configuration gets: the median of its runs
        return statistics.median(runs[key(c)])

    measured = [c for c, _ in in_grid]
    is_default = key(baseline) == key(best)
    outcome = decision.outcome
    advice = None
    if outcome == "tied":
        advice = command_line(args, budget=max(2 * args.budget, 60.0))
    report = {
        "machine": _machine(),
        "dataset": summary,
        "search": "grid" if args.grid else "adaptive",
        "seconds_per_config": args.seconds,
        "measured": len(measured),
        "grid_size": len(grid),
        "baseline_in_grid": baseline in grid,
        "elapsed_s": time.perf_counter() - start,
        "figure": "the median of a configuration's runs; each run is the median rate of 3 timed windows "
        f"({args.seconds:g} s in all, at least {MIN_WINDOW_BATCHES} batches each) after warm-up",
        "measurements": _rows([c for c, _ in searcher.results], details, runs),
        "best": dict(best),  # LoaderConfig fields: LoaderConfig(**report["best"])
        "best_samples_per_s": best_rate,  # the median of its runs, as in "measurements"
        "best_runs": len(runs[key(best)]),
        "decision": {**decision.as_dict(), "rerun": advice},
        "warnings": warnings + dips(in_grid),
        "baseline": {
            **baseline,
            "samples_per_s": rate_of(baseline),
            "runs": len(runs[key(baseline)]),
            "is_best": is_default,
        },
        # Two medians of the same kind; None where the chosen configuration is the baseline itself.
        "speedup_over_baseline": None if is_default else best_rate / rate_of(baseline),
        "bottleneck": verdict,
        "config": to_config(best).replace(seed=None).to_dict(),  # a Loader made from it draws its own seed
    }
    slower = slower_than_default(report)
    report["slower_than_baseline"] = slower is not None
    if slower:
        report["warnings"].append(f"{slower}: --save-profile saves no profile from this run")
    if args.model:
        report["model"] = model
    return report


def _json(report: dict) -> Callable[[IO[Any]], None]:
    return lambda f: json.dump(report, f, indent=2, default=str)


def interrupted(args: argparse.Namespace, report: dict) -> int:
    """Ctrl-C while measuring: says so, keeps the measurements made (``--json``), saves nothing else."""
    print(
        f"\nfastload tune: interrupted after {report['measured']} of {report['grid_size']} configurations: "
        "nothing chosen, no plot, no profile saved",
        file=sys.stderr,
    )
    if args.json_out:
        write_output(args.json_out, "--json", _json(report), ".json")
    return 130  # the shell's status for a SIGINT


def main(args: argparse.Namespace) -> int:
    if args.forget:
        return forget(args)
    # Fail before measuring, not after.
    check_root(args)
    check_output(args.json_out, "--json")
    check_output(args.plot, "--plot")
    kind = os.path.splitext(args.plot or "")[1].lstrip(".").lower() or "png"  # savefig reads it from the name
    if args.plot:
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise ImportError("--plot needs matplotlib: pip install 'fastload[plot]'") from None
        formats = Figure().canvas.get_supported_filetypes()
        if kind not in formats:
            raise ValueError(f"--plot {args.plot}: matplotlib writes no {kind!r} files; name one of {sorted(formats)}")
    try:
        report = run(args)
    except Interrupted as stop:
        return interrupted(args, stop.report)
    print_table(report)
    ok = True
    if args.json_out:
        ok &= write_output(args.json_out, "--json", _json(report), ".json")
    if args.plot:
        ok &= write_output(args.plot, "--plot", lambda f: plot(report, f, kind), f".{kind}", binary=True)
    if args.save_profile:
        ok &= save_profile(args, report)
    return 0 if ok else 1
