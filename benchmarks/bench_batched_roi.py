"""Batched region decode on the CPU: one nvImageCodec call per batch against one call per
sample, and against the strict per-sample path that decodes whole images.

Training preset (RandomResizedCrop + flip, antialiased), batches of ``--batch-size`` real
photos, one core (the process is pinned to one CPU, torch and nvImageCodec to one
thread), every row timed on the same batch before the next batch, rounds repeated:

* "batch, per-sample path, no region": the default, strict: full (or DCT-scaled) decodes only;
* "batch, per-sample path, region": files trusted (``FASTLOAD_ROI=trusted``: region decode
  cannot see corrupt data, ``bench_damage.py``), a region decode per sample, one call each;
* "batch, batched path, region": files trusted, the batch's regions in one call
  (:mod:`fastload.sources.batchplan`);
* the stages of the batched path: plan (read, header, crop, decode plan), the region
  decodes (one call per sample vs one per batch, the same regions) against a full decode
  of the same images, finish (the other decodes, resize, flip).

The three pipeline rows run in a rotating order, so that no row always finds the batch's
bytes freshest in the caches.

Wall time and CPU time (all threads of the process) are both printed: other jobs on a
shared machine inflate the first, hardly the second.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from common import parser, photo_folder, report

import fastload as fl
from fastload.datasets.protocols import LoadTraits
from fastload.decode import get_decoder, plan, roi
from fastload.sources import batchplan
from fastload.sources.batchplan import BatchPlan, decode_regions, plan_row
from fastload.sources.maker import BatchMaker
from fastload.sources.pools import PlainPool
from fastload.sources.request import BatchRequest


class PerSample(fl.ImageFolder):
    load_traits = LoadTraits(takes_out=True)  # loaded whole, into the batch row, not planned

    def load(self, index, epoch=0, seed=0, out=None):  # an override: the sources keep the per-sample path
        return super().load(index, epoch, seed, out)


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if not roi.available():
        raise SystemExit("needs nvImageCodec: pip install 'fastload[roi]'")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    root = photo_folder(args)
    batch = 16 if args.quick else args.batch_size
    rounds = 1 if args.quick else args.rounds
    tf = fl.transforms.train(args.size)
    datasets = {
        "batch, per-sample path, no region": fl.ImageFolder(root, tf),
        "batch, per-sample path, region": PerSample(root, tf),
        "batch, batched path, region": fl.ImageFolder(root, tf),
    }
    fitted = plan.get_planner().costs
    # Each row's planner, set before it runs: the default (strict), or one for trusted files.
    planners = {name: plan.Planner(fitted, region="no region" not in name) for name in datasets}
    trusted = planners["batch, batched path, region"]
    # The batched row's batches are planned ahead, its regions decoded in one call (what the
    # sources do under FASTLOAD_ROI=trusted); the others load sample by sample.
    makers = {name: BatchMaker.of(ds) for name, ds in datasets.items()}
    for name, m in makers.items():
        m.executor = batchplan.BatchedRegions() if "batched" in name else batchplan.PerSample()
    clean = datasets["batch, batched path, region"]
    stage_loader = makers["batch, batched path, region"].loader
    pool = PlainPool(pin=False)
    rd = roi.get_region_decoder()
    n = len(clean) // batch * batch
    full = get_decoder()
    rows = [
        *makers,
        "stage: plan",
        "stage: full decode of the region-planned images",
        "stage: region decode, one call per sample",
        "stage: region decode, one call per batch",
        "stage: finish",
    ]
    wall = {r: [] for r in rows}
    cpu_t = {r: [] for r in rows}
    regions = 0

    def record(name: str, start: tuple[float, float]) -> None:
        w, c = clocks()
        wall[name][-1] += w - start[0]
        cpu_t[name][-1] += c - start[1]

    for name, m in makers.items():  # warm up: decoders, planner, files in the page cache
        plan.set_planner(planners[name])
        m.make(BatchRequest(0, np.arange(batch)), 0, pool)
    for _ in range(rounds):
        for r in rows:
            wall[r].append(0.0)
            cpu_t[r].append(0.0)
        for k, first in enumerate(range(0, n, batch)):
            request = BatchRequest(1, np.arange(first, first + batch))
            names = list(makers)
            for name in names[k % 3 :] + names[: k % 3]:
                plan.set_planner(planners[name])
                start = clocks()
                makers[name].make(request, 0, pool)
                record(name, start)
            plan.set_planner(trusted)
            start = clocks()
            planned = BatchPlan.of(request)
            for j in range(len(planned)):
                plan_row(stage_loader, planned, j, 0)
            record("stage: plan", start)
            plans = [r.plan for r in planned.rows]
            group = [pl for pl in plans if pl is not None and pl.region is not None]
            regions += len(group)
            start = clocks()
            for pl in group:
                full.decode(pl.data, header=pl.header)
            record("stage: full decode of the region-planned images", start)
            start = clocks()
            for pl in group:
                rd.decode(pl.data, *pl.region)
            record("stage: region decode, one call per sample", start)
            start = clocks()
            decode_regions(stage_loader, planned, 0)
            record("stage: region decode, one call per batch", start)
            out = np.empty((args.size, args.size, 3), np.uint8)
            start = clocks()
            for r in planned.rows:
                clean.finish(r.plan, r.pixels, out)
            record("stage: finish", start)
    share = regions / (n * rounds)
    base_name = "batch, per-sample path, no region"
    best = {r: (min(wall[r]) / n * 1e6, min(cpu_t[r]) / n * 1e6) for r in rows}
    print(
        f"{n} photos from {root}, batches of {batch}, RandomResizedCrop({args.size}) + flip, one core "
        f"(cpu {cpu}), {rounds} interleaved rounds, best round; region plans: {share:.0%} of samples; "
        f"planner costs: {'calibrated' if 'seconds' in fitted else 'built-in'}"
    )
    print(f"  {'row':46s} {'wall us/img':>12s} {'cpu us/img':>11s}  vs no-region path (cpu)")
    for r in rows:
        w, c = best[r]
        ratio = f"{c / best[base_name][1]:.2f}x" if not r.startswith("stage") else ""
        print(f"  {r:46s} {w:12.0f} {c:11.0f}  {ratio}")
    whole = best["stage: full decode of the region-planned images"][1]
    per_call = best["stage: region decode, one call per sample"][1]
    per_batch = best["stage: region decode, one call per batch"][1]
    if share:
        print(
            f"  region-planned images (cpu, per image decoded): full decode {whole / share:.0f} us, region one "
            f"call per sample {per_call / share:.0f} us ({per_call / whole:.2f}x full), one call per batch "
            f"{per_batch / share:.0f} us ({per_batch / whole:.2f}x full; {per_batch / per_call:.2f}x one per call)"
        )
    for r in rows:
        print(
            f"  rounds, {r}: wall "
            + ", ".join(f"{v / n * 1e6:.0f}" for v in wall[r])
            + " | cpu "
            + ", ".join(f"{v / n * 1e6:.0f}" for v in cpu_t[r])
        )
    report(
        "bench_batched_roi",
        args,
        {
            "images": n,
            "batch_size": batch,
            "rounds": rounds,
            "cpu": cpu,
            "region_share": share,
            "best_us_per_image": {r: {"wall": w, "cpu": c} for r, (w, c) in best.items()},
            "rounds_us_per_image": {
                r: {"wall": [v / n * 1e6 for v in wall[r]], "cpu": [v / n * 1e6 for v in cpu_t[r]]} for r in rows
            },
            "region_decode": roi.version(),
        },
    )


if __name__ == "__main__":
    main()
