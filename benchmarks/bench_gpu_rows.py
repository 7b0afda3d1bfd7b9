"""GPU decode's row step: the per-row loop (the executor before rows.py) against the Triton kernel.

A batch of decoded images (uint8 H×W×3 on the device, each in its own memory, as
nvImageCodec hands them over) becomes 224×224 uint8 channels_last rows: a box drawn as
RandomResizedCrop draws it (area 8-100 %, aspect 3/4-4/3), resized with
``interpolate(antialias=True)``, flipped for half the rows, rounded. Two ways:

- ``loop``: the executor's code before :mod:`fastload.device.gpudecode.rows`: per row a cut,
  a float32 ``F.interpolate`` and a copy into the batch (about three launches), then the
  flips and the rounding batch-wide.
- ``kernel``: :func:`~fastload.device.gpudecode.rows.resize_rows` with ``method="triton"``:
  the table copied to the device and one launch.

Cases: 256 images of about 0.19 MP (500×375, ImageNet's typical size) and 256 of about
4 MP (2448×1632, a phone photo). Timed per batch after a warm-up (Triton compiles on the
first call): ``device_ms`` with CUDA events around the call (the work queued on the
stream), ``host_ms`` the calling thread's wall time to queue it (what the driver's thread
holds the GIL for), min / median / max over ``--repeats``. ``max_diff``: the largest
difference in levels between the two outputs (the kernel follows the CUDA kernel's math;
the CPU's float kernel, which the tests compare with, is within a level).
``--cpu`` (or ``--quick``, the dry run of tests/test_benchmarks.py): tiny sizes on the CPU,
the kernel in Triton's interpreter (checks the script). Without CUDA and either: says so,
exits 0 (``make bench`` runs every benchmark). One JSON line per case to stdout and, with
``--json PATH``, appended to PATH.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fastload.device.gpudecode.rows import resize_rows  # noqa: E402

Table = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def plan(shapes: list[tuple[int, int]], out: tuple[int, int], rng: np.random.Generator) -> Table:
    """RandomResizedCrop's boxes (scale 0.08-1, log-uniform aspect 3/4-4/3), resized to ``out``."""
    boxes = []
    for h, w in shapes:
        area = h * w * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        bw, bh = min(w, max(1, round(math.sqrt(area * aspect)))), min(h, max(1, round(math.sqrt(area / aspect))))
        y0, x0 = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        boxes.append((y0, x0, y0 + bh, x0 + bw))
    n = len(shapes)
    return (
        np.array(boxes),
        np.tile(np.array(out), (n, 1)),
        np.zeros((n, 2), np.int64),
        rng.random(n) < 0.5,
        rng.permutation(n),
    )


def loop(rows: torch.Tensor, images: list[torch.Tensor], table: Table) -> None:
    """The executor's per-row code before rows.py (float32 on CUDA), into uint8 ``rows``."""
    boxes, resize, windows, flips, dest = table
    n, _, out_h, out_w = rows.shape
    work = torch.empty((n, 3, out_h, out_w), dtype=torch.float32, device=rows.device, memory_format=torch.channels_last)
    flipped = []
    for r, img in enumerate(images):
        j = int(dest[r])
        y0, x0, y1, x1 = (int(v) for v in boxes[r])
        x = img[y0:y1, x0:x1].permute(2, 0, 1).unsqueeze(0)
        x = F.interpolate(
            x.float(), size=tuple(int(v) for v in resize[r]), mode="bilinear", antialias=True, align_corners=False
        )
        wy, wx = (int(v) for v in windows[r])
        work[j].copy_(x[0, :, wy : wy + out_h, wx : wx + out_w])
        if flips[r]:
            flipped.append(j)
    if flipped:
        at = torch.tensor(flipped, dtype=torch.int64)
        at = at.pin_memory().to(rows.device, non_blocking=True) if rows.is_cuda else at
        work.index_copy_(0, at, work.index_select(0, at).flip(-1))
    rows.copy_(work.round_().clamp_(0, 255))


def kernel(rows: torch.Tensor, images: list[torch.Tensor], table: Table) -> None:
    resize_rows(rows, images, *table, method="triton")


def timed(fn: Callable[[], None], device: torch.device, repeats: int) -> tuple[list[float], list[float]]:
    """(device ms, host ms) of each of ``repeats`` calls of ``fn``."""
    dev, host = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t = time.perf_counter()
            start.record()
            fn()
            end.record()
            host.append((time.perf_counter() - t) * 1e3)
            end.synchronize()
            dev.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t) * 1e3)
            dev.append(host[-1])
    return dev, host


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU, the kernel in Triton's interpreter")
    p.add_argument("--quick", action="store_true", help="the same as --cpu (the benchmarks' dry-run flag)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each (at least 3)")
    p.add_argument("--rows", type=int, default=256, help="images per batch")
    p.add_argument("--json", default=None, help="append each case as one JSON line to this file")
    p.add_argument("--data", default=None, help="unused (the images are made on the device)")
    args = p.parse_args()
    if args.repeats < 3:
        p.error("--repeats must be at least 3")
    quick = args.cpu or args.quick
    if quick:
        torch.set_num_threads(1)  # on a busy machine, several threads per op spin against each other
        device, out, n = torch.device("cpu"), (16, 16), min(args.rows, 3)
        cases = {"tiny": (48, 64)}
    elif torch.cuda.is_available():
        device, out, n = torch.device("cuda"), (224, 224), args.rows
        cases = {"0.19MP": (375, 500), "4MP": (1632, 2448)}
    else:
        print("bench_gpu_rows needs a CUDA GPU; --cpu runs it on the CPU (tiny sizes, Triton's interpreter)")
        raise SystemExit(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rng = np.random.default_rng(0)
    for case, (h, w) in cases.items():
        record = run_case(case, (h, w), n, out, device, rng, args.repeats)
        record.update(device=name, torch=torch.__version__, quick=quick)
        line = json.dumps(record)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")


def run_case(
    case: str,
    size: tuple[int, int],
    n: int,
    out: tuple[int, int],
    device: torch.device,
    rng: np.random.Generator,
    repeats: int,
) -> dict:
    """Both ways on ``n`` random images of ``size``: their times and how far apart their rows are."""
    gen = torch.Generator(device=device).manual_seed(0)
    images = [torch.randint(0, 256, (*size, 3), dtype=torch.uint8, device=device, generator=gen) for _ in range(n)]
    table = plan([size] * n, out, rng)
    outs, times = {}, {}
    for method, fn in (("loop", loop), ("kernel", kernel)):
        rows = torch.empty((n, 3, *out), dtype=torch.uint8, device=device, memory_format=torch.channels_last)
        fn(rows, images, table)  # warm-up: Triton compiles, caches settle
        times[method] = timed(lambda fn=fn, rows=rows: fn(rows, images, table), device, repeats)
        outs[method] = rows
    diff = (outs["loop"].int() - outs["kernel"].int()).abs()
    record = {
        "benchmark": "bench_gpu_rows",
        "case": case,
        "rows": n,
        "image": list(size),
        "out": list(out),
        "repeats": repeats,
        "box_scale_max": round(float(((table[0][:, 2:] - table[0][:, :2]) / table[1]).max()), 2),
    }
    for method, (dev, host) in times.items():
        record[f"{method}_device_ms"], record[f"{method}_host_ms"] = spread(dev), spread(host)
    record["speedup_device"] = round(statistics.median(times["loop"][0]) / statistics.median(times["kernel"][0]), 2)
    record["speedup_host"] = round(statistics.median(times["loop"][1]) / statistics.median(times["kernel"][1]), 2)
    record.update(max_diff=int(diff.max()), mean_diff=round(float(diff.float().mean()), 4))
    return record


if __name__ == "__main__":
    main()
