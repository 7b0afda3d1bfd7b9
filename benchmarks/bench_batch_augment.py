"""The per-batch stage: fl.augment against timm's Mixup and RandomErasing on the same
normalized batch (real photos, N×3×224×224 channels_last), interleaved, on this process's
device (the CPU here; the GPU where there is one).

Each round times every pipeline once, in alternating order, on a fresh copy of the batch;
the table gives medians and the ratio timm / fastload (> 1: fastload is faster). timm's
recipe is its train.py's with ``--no-prefetcher``: RandomErasing in the loader, then Mixup in
the training loop (with its prefetcher, the default, timm mixes in the workers' collate and
erases after; the device stage then runs RandomErasing alone).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import torch
from common import parser, report

import fastload as fl
from fastload.photos.bundled import source_photos


def photo_batch(n: int, size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``n`` random crops of scikit-image's colour photos, normalized as the Loader does."""
    photos = [p for p in source_photos(gray=False).values() if p.ndim == 3 and min(p.shape[:2]) >= size]
    rng = np.random.default_rng(0)
    crops = []
    for i in range(n):
        p = photos[i % len(photos)]
        y, x = rng.integers(0, p.shape[0] - size + 1), rng.integers(0, p.shape[1] - size + 1)
        crops.append(p[y:y + size, x:x + size, :3])
    batch = torch.from_numpy(np.stack(crops)).to(device)
    return fl.Normalizer(dtype=dtype)(batch)


def timm_recipe(timm, args, device):
    erase = timm.data.random_erasing.RandomErasing(args.reprob, mode="pixel", device=str(device))
    mix = timm.data.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000, mode=args.mode)
    return lambda x, y, g: mix(erase(x), y)


def fastload_recipe(args):
    steps = fl.augment.BatchTransforms([
        fl.augment.RandomErasing(args.reprob, mode="pixel"),
        fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000, mode=args.mode)])
    counter = iter(range(10**9))
    return lambda x, y, g: steps.apply((x, y), seed=0, epoch=0, batch=next(counter))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--mode", default="batch", choices=("batch", "pair", "elem"))
    p.add_argument("--reprob", type=float, default=0.25)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--device", default=None)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import refs  # test-only peer: stubs torchvision's compiled ops before timm imports it

    refs.stub_meta_registrations()
    import timm.data

    device = fl.config.resolve_device(args.device)
    n, rounds = (16, 3) if args.quick else (args.batch_size, args.rounds)
    batch = photo_batch(n, 224, device, getattr(torch, args.dtype))
    labels = torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(0)).to(device)
    pipelines = {"fastload": fastload_recipe(args), "timm": timm_recipe(timm, args, device)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in pipelines}
    for r in range(rounds + 1):  # round 0 warms up
        order = list(pipelines) if r % 2 == 0 else list(reversed(pipelines))
        for name in order:
            x = batch.clone()
            sync()
            start = time.perf_counter()
            out, target = pipelines[name](x, labels, None)
            sync()
            if r:
                times[name].append(time.perf_counter() - start)
            assert out.shape == batch.shape and target.shape == (n, 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"batch {n}x3x224x224 {args.dtype} channels_last on {device}, torch threads {torch.get_num_threads()}, "
          f"RandomErasing({args.reprob}, pixel) + Mixup(0.8, 1.0, mode={args.mode!r}, smoothing 0.1), "
          f"{rounds} rounds (medians):")
    for name, t in med.items():
        print(f"  {name:9s} {1e3 * t:8.2f} ms/batch  {n / t:9.0f} images/s")
    print(f"  timm / fastload time: {med['timm'] / med['fastload']:.2f}x")
    report("batch_augment", args, {"device": str(device), "batch": n, "mode": args.mode, "dtype": args.dtype,
                                   "ms": {k: 1e3 * v for k, v in med.items()}, "ratio": med["timm"] / med["fastload"]})


if __name__ == "__main__":
    main()
