"""Correctness on the GPU: what ``device="cuda"`` hands out equals what the CPU device does.

1. uint8 batches (``normalize=False``) on the GPU equal the CPU device's byte for byte: same
   seed and shuffle, two epochs, both backends (process, thread), while another stream
   keeps the GPU busy and the consumer is delayed (a kernel queued on its stream before
   it reads each batch, and a host pause): a buffer reused before the consumer read it,
   or read before its copy finished, changes bytes. Each GPU batch is copied on the
   consumer's stream after the delay and compared once the epoch is over, no sync between.
2. normalized float batches equal the CPU device's within 1e-5.
3. the timm recipe's batch stage on the device (RandomErasing 0.25 "pixel", Mixup 0.8 /
   CutMix 1.0, label smoothing 0.1): images finite, soft targets summing to 1.
4. decode="gpu" pixels against the CPU path's (issue 38): the same seeded batch (no
   shuffle, seed 0, ``train(224, reduced_decode=False)``: the same crops, full-scale decode
   both ways) through decode="gpu" (the share option, where the Loader takes it, None: every
   row the GPU can take decoded there) and decode="cpu", uint8 (``normalize=False``); the
   mean absolute difference in levels per image and over the batch. Within 1 level mean
   over the batch passes; the worst image and the images over 1 level are named.

One JSON record of every check; exit status 1 when one fails. --quick: the dry run on the
CPU (both "devices" the CPU, a thread's matrix products standing in for the busy stream).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch
from common import report
from gpu_common import device_or_exit, gpu_parser, mode_options, photos

import fastload as fl

DELAY_CYCLES = 5_000_000  # torch.cuda._sleep: a few milliseconds of GPU time before each read
PAUSE_S = 0.005  # and the host's pause per batch, so the workers and the device stage run ahead
TOLERANCE = 1e-5
PIXELS = "decode='gpu' pixels within 1 level mean of the CPU path"


class Busy:
    """Another stream keeping the GPU busy (matrix products queued there at every batch), or,
    on the CPU, a thread doing the same until stopped."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.a = torch.randn(4096 if self.cuda else 128, 4096 if self.cuda else 128, device=device)
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.stop = threading.Event()
        self.thread = None if self.cuda else threading.Thread(target=self._spin, daemon=True)
        if self.thread is not None:
            self.thread.start()

    def _spin(self) -> None:
        while not self.stop.is_set():
            self.a @ self.a

    def kick(self) -> None:
        if self.cuda:
            with torch.cuda.stream(self.stream):
                for _ in range(4):
                    self.a @ self.a

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def delayed_copies(loader: fl.Loader, busy: Busy) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One pass: each batch copied on the consumer's stream after a delay; no sync inside."""
    got = []
    for x, y in loader:
        busy.kick()
        if x.is_cuda:
            torch.cuda._sleep(DELAY_CYCLES)
        time.sleep(PAUSE_S)
        got.append((x.clone(), y.clone()))
    return got


def compare(gpu: list, cpu: list, exact: bool) -> tuple[bool, str, float]:
    """(equal, what differs, largest difference) of two passes' batches."""
    if len(gpu) != len(cpu):
        return False, f"{len(gpu)} batches against the CPU's {len(cpu)}", float("inf")
    worst = 0.0
    for i, ((gx, gy), (cx, cy)) in enumerate(zip(gpu, cpu)):
        gx, gy = gx.cpu(), gy.cpu()
        if gx.shape != cx.shape or gx.dtype != cx.dtype or not torch.equal(gy, cy):
            return False, f"batch {i}: {gx.dtype} {tuple(gx.shape)} against {cx.dtype} {tuple(cx.shape)}", float("inf")
        diff = (gx.double() - cx.double()).abs().max().item()
        worst = max(worst, diff)
        if (exact and diff != 0) or diff > TOLERANCE:
            rows = int(((gx.double() - cx.double()).abs().flatten(1).amax(1) > 0).sum())
            return False, f"batch {i}: {rows} of {len(gx)} images differ (by up to {diff:.3g})", worst
    return True, f"{len(gpu)} batches", worst


def check_uint8(ds: Any, device: torch.device, backend: str, opts: dict) -> dict:
    busy = Busy(device)
    try:
        with fl.Loader(ds, device=device, backend=backend, normalize=False, **opts) as gpu, \
                fl.Loader(ds, device="cpu", backend=backend, normalize=False, **opts) as cpu:
            epochs = []
            for epoch in (0, 1):
                gpu.set_epoch(epoch)
                cpu.set_epoch(epoch)
                got = delayed_copies(gpu, busy)
                want = [(x.clone(), y.clone()) for x, y in cpu]
                epochs.append((got, want))
    finally:
        busy.close()
    ok, details = True, []
    for epoch, (got, want) in enumerate(epochs):
        same, what, _ = compare(got, want, exact=True)
        ok &= same
        details.append(f"epoch {epoch}: {'equal' if same else 'DIFFERENT'}, {what}")
    # The two epochs are two different passes (a new shuffle), or the check compares one twice.
    reshuffled = not torch.equal(epochs[0][1][0][1], epochs[1][1][0][1])
    details.append("epochs shuffled differently" if reshuffled else "epoch 1 repeats epoch 0's order")
    return {"ok": ok and reshuffled, "detail": "; ".join(details)}


def check_normalized(ds: Any, device: torch.device, opts: dict) -> dict:
    with fl.Loader(ds, device=device, **opts) as gpu, fl.Loader(ds, device="cpu", **opts) as cpu:
        got = [(x.clone(), y.clone()) for x, y in gpu]
        want = [(x, y) for x, y in cpu]
    ok, what, worst = compare(got, want, exact=False)
    return {"ok": ok, "detail": f"{what}; largest difference {worst:.3g} (tolerance {TOLERANCE:g})", "max_diff": worst}


def check_batch_transform(ds: Any, device: torch.device, opts: dict, classes: int) -> dict:
    stage = [fl.augment.RandomErasing(0.25, mode="pixel", device=device),
             fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=classes)]
    finite, worst, batches = True, 0.0, 0
    with fl.Loader(ds, device=device, batch_transform=stage, **opts) as loader:
        for x, y in loader:
            finite &= bool(torch.isfinite(x).all()) and x.device.type == device.type
            worst = max(worst, (y.sum(1) - 1).abs().max().item())
            batches += 1
    ok = finite and worst <= TOLERANCE and batches > 0
    return {"ok": ok, "detail": f"{batches} batches: images {'finite' if finite else 'NOT FINITE'} on "
                                f"{device.type}; soft targets sum to 1 within {worst:.2g}"}


def check_gpu_decode_pixels(paths: list[str], labels: list[int], root: str, device: torch.device, bs: int,
                            workers: int) -> dict:
    """decode="gpu" against decode="cpu" on one seeded batch (the module doc, check 4)."""
    ds = fl.ImageList.from_arrays(paths[:bs], labels[:bs], root, transform=fl.transforms.train(224,
                                                                                               reduced_decode=False))
    opts = dict(batch_size=bs, num_workers=workers, shuffle=False, seed=0, normalize=False, device=device)
    batches = {}
    for mode in ("gpu", "cpu"):
        with fl.Loader(ds, **opts, **mode_options(mode)) as loader:
            x, y = next(iter(loader))[:2]
            batches[mode] = (x.cpu(), y.cpu())
    (xg, yg), (xc, yc) = batches["gpu"], batches["cpu"]
    if xg.shape != xc.shape or not torch.equal(yg, yc):
        return {"ok": False, "detail": f"gpu {tuple(xg.shape)} against cpu {tuple(xc.shape)}, labels "
                                       f"{'equal' if torch.equal(yg, yc) else 'differ'}"}
    per_image = (xg.double() - xc.double()).abs().flatten(1).mean(1)
    batch_mean, worst = per_image.mean().item(), per_image.max().item()
    over = int((per_image > 1).sum())
    return {"ok": batch_mean <= 1.0, "mean_abs_levels": batch_mean, "per_image_max": worst, "images_over_1": over,
            "per_image": [round(v, 3) for v in per_image.tolist()],
            "detail": f"{len(per_image)} images: mean |gpu - cpu| {batch_mean:.3f} levels over the batch (within 1), "
                      f"worst image {worst:.3f} (row {int(per_image.argmax())}), {over} image(s) over 1 level"}


def main() -> int:
    p = gpu_parser(__doc__.splitlines()[0], workers=4)
    p.add_argument("--samples", type=int, default=512, help="photos compared (default: 512)")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    device = device_or_exit(args, "gpu_correct")
    root, paths, labels = photos(args)
    n, bs, workers = (len(paths), 8, 2) if args.quick else (min(args.samples, len(paths)), args.batch_size,
                                                            args.workers)
    ds = fl.ImageList.from_arrays(paths[:n], labels[:n], root, transform=fl.transforms.train(224))
    opts = dict(batch_size=bs, num_workers=workers, shuffle=True, seed=3)
    checks = {f"uint8 equal, {b} backend, 2 epochs": check_uint8(ds, device, b, opts) for b in ("process", "thread")}
    checks["normalized within 1e-5"] = check_normalized(ds, device, opts)
    checks["batch_transform finite, targets sum to 1"] = check_batch_transform(ds, device, opts, max(labels) + 1)
    if device.type != "cuda":
        os.environ["FASTLOAD_GPU_DECODE_ON_CPU"] = "1"  # the dry run: nvImageCodec's CPU backend
    checks[PIXELS] = check_gpu_decode_pixels(paths, labels, root, device, bs, workers)
    for name, c in checks.items():
        print(f"  {'ok  ' if c['ok'] else 'FAIL'} {name}: {c['detail']}")
    report("correctness", args, {"checks": checks, "samples": n, "batch_size": bs, "workers": workers,
                                 "device": str(device)})
    failed = [name for name, c in checks.items() if not c["ok"]]
    print(f"correctness on {device}: {len(checks) - len(failed)} of {len(checks)} checks passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
