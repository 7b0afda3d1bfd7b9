"""GPU decode against the CPU pipeline: images/s of RandomResizedCrop 224 + flip + normalize.

Both loaders read the same real photos with the same seed, shuffle and batch size, and
deliver normalized float batches on the device; rounds alternate between them (best
round of each, all rounds printed). ``decode="cpu"``: ``--workers`` processes decode,
crop, resize and flip, the device stage normalizes. ``decode="gpu"``: the workers only
read bytes and draw crops; the batch is decoded (nvImageCodec: nvJPEG, the GPU's
hardware decoder where it has one), cropped, resized, flipped and normalized on the GPU.
Targets on an H100 with 16 workers: >= 10,000 images/s, >= 2x the CPU pipeline.

Without a GPU the same comparison runs on the CPU, the GPU stage with nvImageCodec's CPU
backend standing in (``FASTLOAD_GPU_DECODE_ON_CPU=1``): a check that it runs, not a GPU figure.
"""

from __future__ import annotations

import os
import time

import torch
from common import loader_parser, photo_folder, report

import fastload as fl


def rate(loader: fl.Loader, epochs: int, sync) -> float:
    """images/s over ``epochs`` epochs after a warm-up epoch, work queued on the device included."""
    for _ in loader:
        pass
    sync()
    start, images = time.perf_counter(), 0
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        images += sum(y.shape[0] for _, y in loader)
    sync()
    return images / (time.perf_counter() - start)


def main() -> None:
    p = loader_parser(__doc__.splitlines()[0], epochs=2)
    p.set_defaults(batch_size=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ["FASTLOAD_GPU_DECODE_ON_CPU"] = "1"
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    root = photo_folder(args)
    batch = 16 if args.quick else args.batch_size
    workers = 0 if args.quick else args.workers  # --quick: no worker start-up
    epochs, rounds = (1, 1) if args.quick else (args.epochs, args.rounds)
    ds = fl.ImageFolder(root, fl.transforms.train(args.size))
    loaders = {decode: fl.Loader(ds, batch_size=batch, num_workers=workers, shuffle=True, drop_last=True,
                                 device=device, decode=decode) for decode in ("cpu", "gpu")}
    runs: dict[str, list[float]] = {d: [] for d in loaders}
    try:
        for _ in range(rounds):
            for decode, loader in loaders.items():
                runs[decode].append(rate(loader, epochs, sync))
        fallbacks = loaders["gpu"].stats()["cpu_fallback_rows"]
    finally:
        for loader in loaders.values():
            loader.close()
    best = {d: max(v) for d, v in runs.items()}
    where = torch.cuda.get_device_name(0) if cuda else "no GPU: the GPU stage ran on the CPU stand-in"
    print(f"{len(ds)} photos from {root}, RandomResizedCrop({args.size}) + flip + normalize, batch {batch}, "
          f"{workers} workers, device {device} ({where}), {rounds} rounds of {epochs} epochs, best round:")
    for d, r in best.items():
        print(f"  decode={d!r}: {r:8.0f} images/s (rounds: " + ", ".join(f"{v:.0f}" for v in runs[d]) + ")")
    ratio = best["gpu"] / best["cpu"]
    print(f"  GPU decode / CPU pipeline: {ratio:.2f}x; rows the GPU decoder refused (decoded on the CPU): {fallbacks}")
    if cuda:
        print(f"  targets: >= 10,000 images/s {'met' if best['gpu'] >= 10_000 else 'missed'}, "
              f">= 2x the CPU pipeline {'met' if ratio >= 2 else 'missed'}")
    report("bench_gpu_decode", args, {"images": len(ds), "batch_size": batch, "workers": workers, "device": device,
                                      "images_per_s": best, "rounds": runs, "gpu_vs_cpu": ratio,
                                      "fallbacks": fallbacks})


if __name__ == "__main__":
    main()
