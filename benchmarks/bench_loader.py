"""Loader throughput: fastload against the classic torchvision-style pipeline and the
timm/apex style, same images, workers and batch size, in one run.

Training pipeline: RandomResizedCrop 224, flip, collate, normalize.
Eval pipeline: resize 256, centre crop 224, collate, normalize.
"""

from __future__ import annotations

import glob
import os
import time

import torch
from common import loader_parser, report, sample_folder
from peers import ClassicDataset, TimmDataset, timm_fast_collate, timm_normalize

import fastload as fl
from fastload.decode import get_decoder


def rate(batches_fn, epochs: int) -> float:
    """images/s over ``epochs`` epochs after one warm-up epoch (workers started)."""
    count = sum(x.shape[0] for x, _ in batches_fn())
    start, images = time.perf_counter(), 0
    for _ in range(epochs):
        images += sum(x.shape[0] for x, _ in batches_fn())
    assert count > 0
    return images / (time.perf_counter() - start)


def decode_limit(paths: list[str], cores: int) -> float:
    dec = get_decoder()
    blobs = [open(p, "rb").read() for p in paths]
    start = time.perf_counter()
    for b in blobs:
        dec.decode(b)
    return len(blobs) / (time.perf_counter() - start) * cores


def main() -> None:
    p = loader_parser(__doc__)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    root = sample_folder(args)
    epochs = 1 if args.quick else args.epochs
    bs, workers = (8, 2) if args.quick else (args.batch_size, args.workers)
    ds_paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    labels = [sorted(os.listdir(root)).index(os.path.basename(os.path.dirname(p))) for p in ds_paths]
    limit = decode_limit(ds_paths, workers)
    common = dict(batch_size=bs, num_workers=workers, persistent_workers=True)
    results = {}
    for mode, train in (("train", True), ("eval", False)):
        transform = fl.transforms.train(224) if train else fl.transforms.eval(224)
        ds = fl.ImageFolder(root, transform)
        ours = {(backend, norm): fl.Loader(ds, batch_size=bs, num_workers=workers, shuffle=True, device="cpu",
                                           backend=backend, normalize=norm)
                for backend in ("process", "thread") for norm in (True, False)}
        classic = torch.utils.data.DataLoader(ClassicDataset(ds_paths, labels, train), shuffle=True, **common)
        timm = torch.utils.data.DataLoader(TimmDataset(ds_paths, labels, train), shuffle=True,
                                           collate_fn=timm_fast_collate, **common)
        pipelines = {f"fastload {b}{'' if n else ' uint8'}": (lambda loader=loader: iter(loader))
                     for (b, n), loader in ours.items()}
        pipelines["classic"] = lambda: iter(classic)
        pipelines["timm"] = lambda: ((timm_normalize(x), y) for x, y in timm)
        pipelines["timm uint8"] = lambda: iter(timm)
        # Interleaved rounds, best of each: drift on a shared machine hits every pipeline alike.
        runs: dict = {name: [] for name in pipelines}
        for _ in range(rounds):
            for name, batches in pipelines.items():
                runs[name].append(rate(batches, epochs))
        r = {name: max(v) for name, v in runs.items()}
        for loader in ours.values():
            loader.close()
        results[mode] = r
        fast = r["fastload process"]
        print(f"{mode}, normalized on the CPU: fastload {fast:.0f} images/s (thread backend "
              f"{r['fastload thread']:.0f}) | classic {r['classic']:.0f} ({fast / r['classic']:.2f}x) | "
              f"timm/apex style {r['timm']:.0f} ({fast / r['timm']:.2f}x) | fastload at {fast / limit:.0%} "
              f"of the decode limit {limit:.0f}")
        print(f"{mode}, uint8 out (normalization left to the GPU): fastload {r['fastload process uint8']:.0f} "
              f"(thread {r['fastload thread uint8']:.0f}) | timm/apex style {r['timm uint8']:.0f} "
              f"({r['fastload process uint8'] / r['timm uint8']:.2f}x) | fastload at "
              f"{r['fastload process uint8'] / limit:.0%} (thread {r['fastload thread uint8'] / limit:.0%}) "
              "of the decode limit")
    print(f"({len(ds_paths)} images, batch {bs}, {workers} workers, {epochs} timed epoch(s) after a warm-up, "
          f"best of {rounds} interleaved round(s))")
    report("bench_loader", args, {"images_per_s": results, "decode_limit": limit, "batch_size": bs,
                                  "workers": workers, "images": len(ds_paths)})


if __name__ == "__main__":
    main()
