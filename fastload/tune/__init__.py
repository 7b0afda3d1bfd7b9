"""``fastload tune``: measure workers × batch size × settings on this machine and dataset."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
from tqdm import tqdm

from .. import transforms
from ..config import LoaderConfig
from ..datasets.open import detect, open_dataset
from ..datasets.protocols import Summarized, is_stream
from ..system import cpu_model, cpus_per_rank
from .decide import decide, key
from .measure import bottleneck, measure_loader
from .noise import dips, leaders
from .options import add_arguments, command_line
from .report import figure, plot, print_table
from .search import Searcher, Space, adaptive_search, grid_search

__all__ = [
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


def check_root(args: argparse.Namespace) -> None:
    """``--root`` is given only with a list file, and is a folder."""
    if getattr(args, "root", None) is None:
        return
    kind = detect(args.dataset)
    if kind != "list":
        raise ValueError(f"--root applies to list files; {args.dataset} is a {kind}")
    if not os.path.isdir(args.root):
        raise FileNotFoundError(f"--root {args.root!r} is not a folder")


def open_tuned(args: argparse.Namespace, transform: Any = None) -> Any:
    """The dataset ``args`` name, list-file paths taken relative to ``--root`` when given."""
    check_root(args)
    if getattr(args, "root", None) is None:
        return open_dataset(args.dataset, transform=transform)
    return open_dataset(args.dataset, transform=transform, root=args.root)


def stream_refusal(name: str, dataset: Any) -> str:
    """Why the tuner cannot measure ``dataset`` (a stream), and what to do, for its kind."""
    kind = type(dataset).__name__
    if kind == "WebDataset":
        return (
            f"{name} is a WebDataset (tar shards), which fastload reads as a stream; the tuner needs random "
            "access by index; nothing in it is compressed: tune on the images it was made from (a folder, "
            "list file, LMDB or TFRecord files), or on an LMDB made from them with tools/folder2lmdb.py"
        )
    return (
        f"{name} is read as a stream ({kind}: GZIP-compressed TFRecord files); the tuner needs random access "
        "by index: uncompress the files first (gunzip), or tune on the images they were made from"
    )


def check_output(path: str | None, flag: str) -> None:
    """Fails now, not after the measurements, when ``path`` cannot be written."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{flag} {path}: folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: folder {folder} is not writable")


def run(args: argparse.Namespace, progress: bool = True) -> dict:
    """Runs the search described by ``args`` (the CLI's namespace); returns the JSON report."""
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
    best, _ = (grid_search if args.grid else adaptive_search)(space, searcher)
    # PyTorch's default: no workers, at the batch size the search chose.
    baseline = {**best, "num_workers": 0, "backend": "process"}
    searcher(baseline)
    in_grid = [(c, r) for c, r in searcher.results if c in grid]  # the baseline may lie outside the grid
    decision = decide(
        leaders(in_grid),
        remeasure,
        baseline=baseline,
        min_rounds=(args.repeats + 1) // 2,
        budget_s=args.budget,
        clock=clock,
    )
    bar.close()

    def rate_of(c: dict) -> float:  # the one figure each configuration gets: the median of its runs
        return statistics.median(runs[key(c)])

    best = decision.chosen
    best_rate = rate_of(best)
    verdict = bottleneck(dataset, to_config(best), best_rate, max(1.0, args.seconds / 2))
    measured = [c for c, _ in in_grid]
    is_default = key(baseline) == key(best)
    outcome = decision.outcome
    advice = None
    if outcome == "tied":
        advice = command_line(args, budget=max(2 * args.budget, 60.0))
    report = {
        "machine": {
            "cpu": cpu_model(),
            "cpus": cpus_per_rank(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "dataset": dataset.summary() if isinstance(dataset, Summarized) else {"path": args.dataset},
        "search": "grid" if args.grid else "adaptive",
        "seconds_per_config": args.seconds,
        "measured": len(measured),
        "grid_size": len(grid),
        "baseline_in_grid": baseline in grid,
        "elapsed_s": time.perf_counter() - start,
        "figure": "the median of a configuration's runs; each run is the median rate of 3 timed windows "
        f"({args.seconds:g} s in all) after warm-up",
        "measurements": [
            {
                **c,
                **details[key(c)],
                "first_run": details[key(c)]["samples_per_s"],
                "samples_per_s": rate_of(c),
                "runs": list(runs[key(c)]),
            }
            for c, _ in searcher.results
        ],
        "best": dict(best),  # LoaderConfig fields: LoaderConfig(**report["best"])
        "best_samples_per_s": best_rate,  # the median of its runs, as in "measurements"
        "best_runs": len(runs[key(best)]),
        "decision": {**decision.as_dict(), "rerun": advice},
        "warnings": dips(in_grid),
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
    if args.model:
        from .model import model_step

        report["model"] = model_step(args.model, args.size, space.values["batch_size"], best_rate)
    return report


def forget(args: argparse.Namespace) -> int:
    """``fastload tune DATASET --forget``: removes this machine's profile for DATASET."""
    from ..loading.profiles import forget as remove

    path = remove(open_tuned(args))
    print(
        f"removed profile {path}: Loader(num_workers='auto') on {args.dataset} uses the CPUs available again"
        if path
        else f"no saved profile for {args.dataset} on this machine"
    )
    return 0


def save_profile(args: argparse.Namespace, report: dict) -> None:
    """Saves the chosen configuration for ``num_workers='auto'``, saying how it was chosen."""
    from ..loading.profiles import forget_hint, save

    dataset = open_tuned(args)
    result = {
        **report["best"],
        "samples_per_s": report["best_samples_per_s"],
        "runs": report["best_runs"],
        "figure": "median of runs",
        "decision": report["decision"]["outcome"],
    }
    path = save(dataset, report["config"], result)
    why = {
        "single": "the only configuration measured",
        "separated": "faster than the other finalist beyond the noise",
        "equivalent": "the cheaper of two finalists within 5% of each other",
        "tied": "the cheaper of two finalists this machine's noise could not separate within --budget",
    }
    workers = report["best"]["num_workers"]
    print(
        f"saved profile {path}: Loader(num_workers='auto') now uses {workers} worker{'' if workers == 1 else 's'} "
        f"({why[report['decision']['outcome']]}); {forget_hint(dataset)}"
    )


def main(args: argparse.Namespace) -> int:
    if args.forget:
        return forget(args)
    # Fail before measuring, not after.
    check_root(args)
    check_output(args.json_out, "--json")
    check_output(args.plot, "--plot")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ImportError("--plot needs matplotlib: pip install 'fastload[plot]'") from None
    report = run(args)
    print_table(report)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2, default=str)
        print(f"wrote {args.json_out}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    if args.save_profile:
        save_profile(args, report)
    return 0
