"""Host-to-device: the Loader's device stage per batch against a plain pinned copy timed the same way.

The same bytes both ways: uint8 batches of 256 x 224x224x3 (38.5 MB) and their int64
labels. The Loader (``normalize=False``, so its device stage only copies; pinned batches)
reports in ``stats()["h2d_gbps"]`` the bytes of its image copies over their time on its
copy stream: events recorded on that side stream around the device allocation of the
images, their copy and the labels' (fastload/device/copy.py). The plain side does exactly
that: on a side stream, an event, ``images.to(device, non_blocking=True)`` and
``labels.to(device, non_blocking=True)`` from pinned memory (allocation and label copy
inside the events), an event; the images' bytes over the time between. Target: the device
stage >= 85% of the plain copy with 14 workers. The Loader's batches must all arrive pinned
(``stats()["unpinned_batches"]`` 0).

For each worker count of --workers-list (14 first: the target's; then 4), plain and stage
are interleaved A B B A (plain, stage, stage, plain: each stage pass a fresh Loader); the
ratio is taken per repeat (the stage pass against the plain pass beside it) and over the
medians.

Why 4 as well: the dataset here does no work but copy ready frames, so its workers write
batches as fast as host memory takes them, beside the copy engine reading it. On the H100
machine (2026-11-26) the device stage reached 91% of the plain copy with 2 and 6 workers
and 46% and 83% with 14, where a lone pinned copy_ fell to 82% with 14 host threads
copying arrays beside it (h2d_contention.py): host memory bandwidth, not the stage. Workers
that decode JPEGs write a few hundred MB/s, not tens of GB/s.

--quick: the dry run on the CPU (small batches; "copies" timed by the host clock).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from common import report
from gpu_common import device_or_exit, gpu_parser, seconds_left, sync

import fastload as fl


class Frames(torch.utils.data.Dataset):
    """Ready H×W×3 uint8 images, no decode: the batch's bytes are all the host does."""

    def __init__(self, n: int, size: int) -> None:
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(16)]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.images[i % len(self.images)], i % 1000


def plain_copy_gbps(bs: int, size: int, batches: int, device: torch.device) -> float:
    """GB/s of the plain copy, per batch, timed as the device stage times its copies (the
    module doc): on a side stream, the allocation, the images' and the labels' copies
    between two events; the images' bytes counted."""
    cuda = device.type == "cuda"
    g = torch.Generator().manual_seed(0)
    host = [(torch.randint(0, 256, (bs, size, size, 3), dtype=torch.uint8, generator=g),
             torch.arange(bs, dtype=torch.int64)) for _ in range(4)]
    if cuda:
        host = [(x.pin_memory(), y.pin_memory()) for x, y in host]
    stream = torch.cuda.Stream(device) if cuda else None
    spans, kept = [], []
    for i in range(batches + 2):
        x, y = host[i % len(host)]
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record(stream)
                images = x.to(device, non_blocking=True)
                labels = y.to(device, non_blocking=True)
                end.record(stream)
        else:
            start = time.perf_counter()
            images, labels = x.clone(), y.clone()
            end = time.perf_counter()
        kept = [images, labels]  # freed at the next batch, as a consumer would
        if i >= 2:  # the first two: warm-up
            spans.append((start, end))
    if cuda:
        torch.cuda.synchronize(device)
    del kept
    seconds = sum(a.elapsed_time(b) / 1e3 if cuda else b - a for a, b in spans)
    return len(spans) * host[0][0].numel() / seconds / 1e9


def stage_pass(bs: int, size: int, batches: int, workers: int, device: torch.device) -> dict:
    """One pass of a fresh Loader over Frames: its device stage's GB/s and counts."""
    with fl.Loader(Frames(bs * (batches + 2), size), batch_size=bs, num_workers=workers, device=device,
                   normalize=False, drop_last=True) as loader:
        n = 0
        for _ in loader:
            n += 1
        sync(device)
        stats = loader.stats()
    return {"stage_gbps": stats["h2d_gbps"], "batches": n, "unpinned_batches": stats["unpinned_batches"]}


def compare(bs: int, size: int, batches: int, workers: int, device: torch.device) -> dict:
    """Plain and stage interleaved A B B A at ``workers``: each pass's GB/s, the per-repeat
    shares (stage / the plain pass beside it) and the share of the medians."""
    plain, stage = [], []
    for side in ("plain", "stage", "stage", "plain"):
        if side == "plain":
            plain.append(plain_copy_gbps(bs, size, batches, device))
        else:
            stage.append(stage_pass(bs, size, batches, workers, device))
    stage_gbps = [s["stage_gbps"] for s in stage]
    pairs = list(zip(plain, stage_gbps))  # plain A with stage A, plain B (the last) with stage B
    shares = [st / pl for pl, st in pairs if st and pl]
    plain_m, stage_m = statistics.median(plain), (statistics.median(stage_gbps) if all(stage_gbps) else None)
    return {"workers": workers, "plain_runs": plain, "stage_runs": stage_gbps, "plain_gbps": plain_m,
            "stage_gbps": stage_m, "stage_share": stage_m / plain_m if stage_m else None,
            "share_per_repeat": shares, "share_min": min(shares) if shares else None,
            "share_max": max(shares) if shares else None, "batches": sum(s["batches"] for s in stage),
            "unpinned_batches": sum(s["unpinned_batches"] for s in stage)}


def main() -> None:
    p = gpu_parser(__doc__.splitlines()[0], workers=14)
    p.add_argument("--batches", type=int, default=40, help="batches each pass (default: 40)")
    p.add_argument("--workers-list", default="14,4", help="worker counts, the target's first (default: 14,4)")
    args = p.parse_args()
    device = device_or_exit(args, "bench_h2d")
    counts = [int(w) for w in args.workers_list.split(",") if w.strip()]
    bs, size, n = (8, 64, 6) if args.quick else (256, 224, args.batches)
    if args.quick:
        counts = [2]
    mb = bs * size * size * 3 / 1e6
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "the CPU (dry run: no copy events)"
    results = []
    for workers in counts:
        if results and seconds_left(args) < 10:
            print(f"H2D with {workers} workers: skipped ({seconds_left(args):.0f} s left)")
            continue
        r = compare(bs, size, n, workers, device)
        results.append(r)
        share = f"{r['stage_share']:.0%} of plain (per repeat {r['share_min']:.0%} to {r['share_max']:.0%})" \
            if r["stage_share"] else "no copy events"
        print(f"H2D of {mb:.1f} MB uint8 batches + labels on {where}, {workers} workers, A B B A: plain copy "
              f"{r['plain_gbps']:.1f} GB/s ({', '.join(f'{v:.1f}' for v in r['plain_runs'])}); Loader device stage "
              f"{r['stage_gbps'] or float('nan'):.1f} GB/s; {share}; target >= 85% with 14 workers; "
              f"{r['batches']} batches, {r['unpinned_batches']} unpinned", flush=True)
    first = results[0]
    report("bench_h2d", args, {"plain_gbps": first["plain_gbps"], "stage_gbps": first["stage_gbps"],
                               "stage_share": first["stage_share"], "workers": first["workers"],
                               "batches": first["batches"], "unpinned_batches": first["unpinned_batches"],
                               "batch_mb": mb, "by_workers": results, "timed_as": "allocation, image and label "
                               "copies between events on a side stream, image bytes counted, both sides"})
    unpinned = sum(r["unpinned_batches"] for r in results)
    if unpinned:
        raise SystemExit(f"bench_h2d: {unpinned} batches arrived unpinned")


if __name__ == "__main__":
    main()
