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

One JSON record of every check; exit status 1 when one fails. --quick: the dry run on the
CPU (both "devices" the CPU, a thread's matrix products standing in for the busy stream).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from common import report
from gpu_common import device_or_exit, gpu_parser, photos

import fastload as fl

DELAY_CYCLES = 5_000_000  # torch.cuda._sleep: a few milliseconds of GPU time before each read
PAUSE_S = 0.005  # and the host's pause per batch, so the workers and the device stage run ahead
TOLERANCE = 1e-5


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
