"""Time to the first batch in a process started by ``torch.multiprocessing.spawn`` (issue 21).

Such a process inherits ``spawn`` as its default start method, so DataLoader workers (and,
before this change, fastload's) are spawned: each re-imports torch and the dataset's
modules before its first sample. fastload now starts its workers by fork there. Each
round spawns one training process, as a DDP script does, which times construction to first
batch (train transform, real photos) in rotating order for:

- fastload, default start method (fork);
- fastload, ``multiprocessing_context="spawn"``: what the default meant in such a process before;
- the peer: a timm-style torch DataLoader with its default there (spawn).

Prints the median of the rounds per pipeline and the before/after ratio.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time

import torch
import torch.multiprocessing as mp
from common import median, parser, photo_folder, photo_set_record, report
from peers import TimmDataset, timm_fast_collate

import fastload as fl

PIPELINES = ("fastload, default (fork)", "fastload, multiprocessing_context='spawn' (before)",
             "timm-style DataLoader (spawn)")


def build(name: str, root: str, batch_size: int, workers: int):
    if name.startswith("fastload"):
        spawn = {"multiprocessing_context": "spawn"} if "spawn" in name else {}
        return fl.Loader(fl.ImageFolder(root, transform=fl.transforms.train(224)), batch_size=batch_size,
                         num_workers=workers, shuffle=True, seed=0, device="cpu", normalize=False, **spawn)
    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    classes = sorted(os.listdir(root))
    labels = [classes.index(os.path.basename(os.path.dirname(p))) for p in paths]
    return torch.utils.data.DataLoader(TimmDataset(paths, labels, True), batch_size=batch_size, shuffle=True,
                                       num_workers=workers, persistent_workers=True, collate_fn=timm_fast_collate)


def training_process(_index: int, root: str, batch_size: int, workers: int, order: list[str], out: str) -> None:
    import multiprocessing

    times = {"inherited_start_method": multiprocessing.get_start_method(allow_none=True)}
    for name in order:
        start = time.perf_counter()
        loader = build(name, root, batch_size, workers)
        next(iter(loader))
        times[name] = time.perf_counter() - start
        if hasattr(loader, "close"):
            loader.close()
        del loader
    with open(out, "w") as f:
        json.dump(times, f)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    workers = 1 if args.quick else args.workers
    root = photo_folder(args)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = list(PIPELINES[r % 3:] + PIPELINES[:r % 3])
            out = os.path.join(tmp, f"{r}.json")
            mp.spawn(training_process, args=(root, args.batch_size, workers, order, out), nprocs=1)
            with open(out) as f:
                runs.append(json.load(f))
            print(f"round {r}: " + ", ".join(f"{n}: {runs[-1][n]:.2f} s" for n in PIPELINES), flush=True)
    result = {name: median([run[name] for run in runs]) for name in PIPELINES}
    print(f"\ninherited start method in the spawned process: {runs[0]['inherited_start_method']!r}")
    print(f"first batch, median of {rounds} round(s), {workers} workers, batch {args.batch_size}:")
    for name in PIPELINES:
        spread = [run[name] for run in runs]
        print(f"  {name:42s} {result[name]:6.2f} s  ({min(spread):.2f}-{max(spread):.2f})")
    before, after = result[PIPELINES[1]], result[PIPELINES[0]]
    print(f"before / after: {before / after:.1f}x; timm-style DataLoader / fastload: "
          f"{result[PIPELINES[2]] / after:.1f}x")
    report("bench_spawn_start", args, {"rounds": runs, "median_s": result, "workers": workers,
                                 "batch_size": args.batch_size, "photos": photo_set_record(root)})


if __name__ == "__main__":
    main()
