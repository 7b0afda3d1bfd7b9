"""Decode planner: the per-sample pipeline against full decode + antialiased resize, with
and without region (ROI) decode, the plans chosen, and the loader's rate with 2 workers.

Training preset (RandomResizedCrop + flip, antialiased), one epoch's crops. One-core
rows time each sample alone, rows interleaved, best of ``--repeat`` per sample:

* decode options: full decode, each DCT scale, a region decode of each sample's crop;
* "full decode + antialiased resize": the reference work, bytes already in memory;
* "pipeline": ``ImageFolder.load`` (read the file, plan, decode, resize into a batch
  slot, flip), with the planner's region decode off and on.

The loader rows run ``fastload.Loader`` (uint8 out, CPU, ``--workers`` processes) against
the machine's full-decode limit: cores x the one-core full-decode rate. Use real photos
(``--data`` a folder of class subfolders); the generated sample data is for ``--quick``.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import numpy as np
import torch
from common import loader_rate, parser, photo_folder, report

import fastload as fl
from fastload.datasets.base import sample_rng
from fastload.decode import get_decoder, plan, read_header, roi
from fastload.system import available_cpus


def time_rows(rows: dict, n: int, repeat: int) -> dict:
    """Mean of each row's best µs per sample, rows interleaved so that drift hits all alike."""
    best = {name: np.full(n, np.inf) for name in rows}
    for fn in rows.values():
        fn(0)
    for _ in range(repeat):
        for i in range(n):
            for name, fn in rows.items():
                start = time.perf_counter()
                fn(i)
                best[name][i] = min(best[name][i], time.perf_counter() - start)
    return {name: float(b.mean() * 1e6) for name, b in best.items()}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2, help="timed loader epochs after a warm-up epoch")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="interleaved loader rounds, best of each")
    p.add_argument("--limit", type=int, default=None, help="one-core rows on the first N samples only")
    args = p.parse_args()
    torch.set_num_threads(1)
    root = photo_folder(args)
    quick = args.quick
    repeat, epochs = (1, 1) if quick else (args.repeat, args.epochs)
    batch = 8 if quick else args.batch_size

    costs = plan.get_planner().costs  # the cached calibration (or the built-in costs)
    has_roi = roi.available()
    planners = {"no region": plan.Planner(costs, region=False)}
    if has_roi:
        planners["region"] = plan.Planner(costs, region=True)
    tf = fl.transforms.train(args.size)
    ds = fl.ImageFolder(root, tf)
    n = min(len(ds), args.limit or len(ds), 32 if quick else len(ds))
    blobs = [ds.read(i)[0] for i in range(n)]
    headers = [read_header(b) for b in blobs]
    crops = [tf.plan(hd.height, hd.width, sample_rng(0, 0, i)) for i, hd in enumerate(headers)]
    dec = get_decoder()
    slot = np.empty((args.size, args.size, 3), np.uint8)

    # One-core decode options.
    options = {"full decode": lambda i: dec.decode(blobs[i], header=headers[i])}
    for s in getattr(dec, "scales", ())[:-1]:
        options[f"DCT scale {s}"] = lambda i, s=s: dec.decode(blobs[i], header=headers[i], scale=s)
    if has_roi:
        rd = roi.get_region_decoder()
        region = [plan.Planner(costs, True).choose(hd, c, False).region or
                  (int(c.top), int(c.left), int(c.top + c.height), int(c.left + c.width))
                  for hd, c in zip(headers, crops)]
        options["region decode of the crop"] = lambda i: rd.decode(blobs[i], *region[i])
    decode_us = time_rows(options, n, repeat)
    full_rate = 1e6 / decode_us["full decode"]

    # One-core pipeline against full decode + antialiased resize.
    def reference(i):
        hd = headers[i]
        return crops[i].apply(dec.decode(blobs[i], header=hd), hd.height, hd.width, slot)

    def pipeline(planner):
        def run(i):
            plan.set_planner(planner)
            return ds.load(i, 0, 0, out=slot)
        return run

    rows = {"full decode + antialiased resize": reference}
    rows.update({f"pipeline, planner ({name})": pipeline(pl) for name, pl in planners.items()})
    pipe_us = time_rows(rows, n, repeat)

    ref = pipe_us["full decode + antialiased resize"]
    print(f"{n} JPEGs from {root}, RandomResizedCrop({args.size}) + flip, antialiased, one core:")
    for name, us in decode_us.items():
        print(f"  {name:42s} {us:7.0f} us  {1e6 / us:6.0f}/s  ({decode_us['full decode'] / us:.2f}x full decode)")
    for name, us in pipe_us.items():
        print(f"  {name:42s} {us:7.0f} us  {1e6 / us:6.0f}/s  ({ref / us:.2f}x full decode + resize)")
    choices = {}
    for name, pl in planners.items():
        counts = Counter(pl.choose(hd, c).kind for hd, c in zip(headers, crops))
        choices[name] = dict(counts)
        print(f"  plans, {name}: " + ", ".join(f"{k} {v / n:.0%}" for k, v in counts.most_common()))

    # The loader, 2 worker processes, uint8 out; rounds interleaved, best of each (a busy
    # moment on a shared machine hits both alike).
    cores = available_cpus()
    limit = full_rate * min(cores, args.workers)
    loaders = {}
    for name, pl in planners.items():
        plan.set_planner(pl)  # the workers, forked on the warm-up pass, keep it
        loaders[name] = fl.Loader(ds, batch_size=batch, num_workers=args.workers, shuffle=True, device="cpu",
                                  normalize=False)
        for _ in loaders[name]:
            pass
    runs: dict = {name: [] for name in loaders}
    try:
        for _ in range(1 if quick else args.rounds):
            for name, loader in loaders.items():
                runs[name].append(loader_rate(loader, epochs))
    finally:
        for loader in loaders.values():
            loader.close()
    loader_rates = {name: max(v) for name, v in runs.items()}
    for name, rate in loader_rates.items():
        print(f"  loader, {args.workers} workers, planner ({name}): {rate:6.0f} images/s = "
              f"{rate / limit:.0%} of the full-decode limit {limit:.0f}/s (rounds: "
              + ", ".join(f"{r:.0f}" for r in runs[name]) + ")")
    plan.set_planner(None)
    report("bench_decode_plan", args, {
        "images": n, "size": args.size, "decode_us": decode_us, "pipeline_us": pipe_us,
        "pipeline_vs_reference": {k: ref / v for k, v in pipe_us.items()}, "plans": choices,
        "loader_images_per_s": loader_rates, "full_decode_limit": limit, "workers": args.workers,
        "batch_size": batch, "calibration": {k: v for k, v in costs.items() if k == "seconds"},
        "region_decode": roi.version() if has_roi else None, "pid": os.getpid()})


if __name__ == "__main__":
    main()
