"""``fastload tune``: measure workers × batch size × settings on this machine and dataset."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
from tqdm import tqdm

from .. import transforms
from ..config import LoaderConfig
from ..datasets.open import detect, open_dataset
from ..system import cpu_model, cpus_per_rank
from .measure import bottleneck, measure_loader
from .noise import confirm
from .report import figure, plot, print_table
from .search import DIMENSIONS, Searcher, Space, adaptive_search, grid_search

__all__ = ["Space", "adaptive_search", "build_args", "figure", "grid_search", "main", "plot", "print_table", "run",
           "worker_candidates"]


def worker_candidates(cpus: int | None = None) -> list[int]:
    """0, 1, 2, 4, 6, ... up to the CPUs this process (rank) may use."""
    cpus = cpus or cpus_per_rank()
    return sorted({0, 1, cpus, *range(2, cpus + 1, 2)})


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{what} is empty")
    return values


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tune", help="find the fastest loader settings for this machine and dataset",
                       description="Measure loader configurations on DATASET and report the fastest.")
    p.add_argument("dataset", help="image folder, list file, LMDB, or TFRecord file(s)/glob")
    p.add_argument("--root", default=None, metavar="DIR",
                   help="folder the paths of a list file are relative to (default: the list file's folder)")
    p.add_argument("--batch-sizes", type=lambda t: _ints(t, "--batch-sizes"), default=[64, 128, 256],
                   metavar="N,N,...", help="batch sizes to try (default: 64,128,256)")
    p.add_argument("--workers", type=lambda t: _ints(t, "--workers"), default=None, metavar="N,N,...",
                   help="worker counts (default: 0,1,2,4,... up to the CPUs available)")
    p.add_argument("--prefetch", type=lambda t: _ints(t, "--prefetch"), default=[2], metavar="N,N,...",
                   help="prefetch factors to try: batches each worker keeps ready (default: 2)")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                   help="pin host batches (default: when the device is CUDA)")
    p.add_argument("--backends", default="process,thread", help="comma-separated: process, thread (default: both)")
    p.add_argument("--transform", choices=["train", "eval"], default="train",
                   help="the preset measured: train (random resized crop + flip) or eval (resize + centre "
                        "crop) (default: train)")
    p.add_argument("--size", type=int, default=224, help="output image size of the transform (default: 224)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per configuration (default: 3)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each of the two leading configurations, alternated, to tell the winner from "
                        "noise (default: 3; at least 2)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where batches are delivered (default: cuda if available, else cpu)")
    p.add_argument("--grid", action="store_true", help="measure every combination (default: adaptive)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write every measurement as JSON")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="plot throughput against workers")
    p.add_argument("--save-profile", action="store_true",
                   help="let num_workers='auto' use the result (refused when noise cannot separate the winner "
                        "from the runner-up)")
    p.add_argument("--forget", action="store_true",
                   help="remove the profile saved for this machine and DATASET, and measure nothing")
    p.add_argument("--model", default=None, help="(CUDA) time a training step of this torchvision/timm model")
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
        return (f"{name} is a WebDataset (tar shards), which fastload reads as a stream; the tuner needs random "
                "access by index; nothing in it is compressed: tune on the images it was made from (a folder, "
                "list file, LMDB or TFRecord files), or on an LMDB made from them with tools/folder2lmdb.py")
    return (f"{name} is read as a stream ({kind}: GZIP-compressed TFRecord files); the tuner needs random access "
            "by index: uncompress the files first (gunzip), or tune on the images they were made from")


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
    space = Space(args.batch_sizes, args.workers if args.workers is not None else worker_candidates(),
                  args.prefetch, backends, pin)
    tf = transforms.train(args.size) if args.transform == "train" else transforms.eval(args.size)
    dataset = open_tuned(args, tf)
    if not hasattr(dataset, "load"):
        raise ValueError(stream_refusal(args.dataset, dataset))
    grid = space.grid()
    budget = len(grid)
    bar = tqdm(total=budget, desc="tuning", unit="config", disable=None if progress else True)

    def to_config(c: dict) -> LoaderConfig:
        # One seed for all candidates: each reads the same samples in the same order.
        return LoaderConfig(device=device, shuffle=True, seed=0, **c)

    def measure(c: dict) -> float:
        res = measure_loader(dataset, to_config(c), args.seconds)
        details[tuple(c[d] for d in DIMENSIONS)] = res
        return res["samples_per_s"]

    def tick(c: dict, rate: float) -> None:
        bar.update(1)
        bar.set_postfix_str(f"bs={c['batch_size']} w={c['num_workers']} {c['backend']}: {rate:.0f}/s")

    def remeasure(c: dict) -> float:
        rate = measure_loader(dataset, to_config(c), args.seconds)["samples_per_s"]
        tick(c, rate)
        return rate

    details: dict = {}
    searcher = Searcher(measure, tick)
    start = time.perf_counter()
    best, _ = (grid_search if args.grid else adaptive_search)(space, searcher)
    # PyTorch's default: no workers, at the batch size the search chose.
    baseline = {**best, "num_workers": 0, "backend": "process"}
    base_rate = searcher(baseline)
    in_grid = [(c, r) for c, r in searcher.results if c in grid]  # the baseline may lie outside the grid
    bar.total = budget + 2 * (args.repeats - 1)
    noise = confirm(in_grid, remeasure, args.repeats)
    bar.close()
    best, best_rate = noise.winner.config, noise.winner.median
    verdict = bottleneck(dataset, to_config(best), best_rate, max(1.0, args.seconds / 2))
    measured = [c for c, _ in in_grid]
    report = {
        "machine": {"cpu": cpu_model(), "cpus": cpus_per_rank(),
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "dataset": dataset.summary() if hasattr(dataset, "summary") else {"path": args.dataset},
        "search": "grid" if args.grid else "adaptive", "seconds_per_config": args.seconds,
        "measured": len(measured), "grid_size": budget, "baseline_in_grid": baseline in grid,
        "elapsed_s": time.perf_counter() - start,
        "measurements": [{**c, **details[tuple(c[d] for d in DIMENSIONS)]} for c, _ in searcher.results],
        "best": dict(best),  # LoaderConfig fields: LoaderConfig(**report["best"])
        "best_samples_per_s": best_rate,  # the median of its repeated runs
        "noise": {"repeats": args.repeats, **noise.as_dict(),
                  "advice": noise.advice(f"fastload tune {args.dataset}")},
        "baseline": {**baseline, "samples_per_s": base_rate},
        "speedup_over_baseline": best_rate / base_rate if base_rate else None,
        "bottleneck": verdict,
        "config": to_config(best).replace(seed=None).to_dict(),  # a Loader made from it draws its own seed
    }
    if args.model:
        from .model import model_step

        report["model"] = model_step(args.model, args.size, space.values["batch_size"], best_rate)
    return report


def forget(args: argparse.Namespace) -> int:
    """``fastload tune DATASET --forget``: removes this machine's profile for DATASET."""
    from ..profiles import forget as remove

    path = remove(open_tuned(args))
    print(f"removed profile {path}: Loader(num_workers='auto') on {args.dataset} uses the CPUs available again"
          if path else f"no saved profile for {args.dataset} on this machine")
    return 0


def save_profile(args: argparse.Namespace, report: dict) -> None:
    """Saves the winner for ``num_workers='auto'`` unless noise could have chosen it."""
    from ..profiles import forget_hint, save

    dataset = open_tuned(args)
    if not report["noise"]["saveable"]:
        print(f"profile NOT saved: noise cannot separate the winner from the runner-up (above); a profile "
              f"would make every Loader(num_workers='auto') on {args.dataset} use it. Nothing was changed.")
        return
    path = save(dataset, report["config"], {**report["best"], "samples_per_s": report["best_samples_per_s"]})
    print(f"saved profile {path}: Loader(num_workers='auto') now uses {report['best']['num_workers']} workers; "
          f"{forget_hint(dataset)}")


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
