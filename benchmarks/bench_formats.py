"""Loader throughput from LMDB and TFRecord against the same images in an image folder,
same transforms, workers and batch size, in one run; and converter speed (no re-encoding)."""

from __future__ import annotations

import os
import tempfile
import time

from common import loader_parser, loader_rate, report, photo_folder

import fastload as fl
from fastload.convert import convert


def rate(ds, bs: int, workers: int, epochs: int) -> float:
    with fl.Loader(ds, batch_size=bs, num_workers=workers, shuffle=True, device="cpu") as loader:
        return loader_rate(loader, epochs)


def main() -> None:
    p = loader_parser(__doc__, epochs=4)
    args = p.parse_args()
    root = photo_folder(args)
    bs, workers, epochs = (8, 2, 1) if args.quick else (args.batch_size, args.workers, args.epochs)
    tf = fl.transforms.train(224)
    with tempfile.TemporaryDirectory() as tmp:
        made = {fmt: convert(root, os.path.join(tmp, fmt), fmt, shards=4 if fmt == "tfrecord" else 1,
                             workers=workers, progress=False) for fmt in ("lmdb", "tfrecord")}
        datasets = {"folder": fl.ImageFolder(root, tf), "lmdb": fl.LMDBDataset(os.path.join(tmp, "lmdb"), tf),
                    "tfrecord": fl.TFRecordDataset(os.path.join(tmp, "tfrecord"), tf)}
        read_us = {}
        for name, ds in datasets.items():
            passes = 1 if args.quick else 5
            start = time.perf_counter()
            for _ in range(passes):
                for i in range(len(ds)):
                    ds.read(i)
            read_us[name] = (time.perf_counter() - start) / (passes * len(ds)) * 1e6
        # Interleaved rounds so drift on a shared machine hits every format alike.
        rates = {k: [] for k in datasets}
        for _ in range(1 if args.quick else 3):
            for name, ds in datasets.items():
                rates[name].append(rate(ds, bs, workers, epochs))
    best = {k: max(v) for k, v in rates.items()}
    print(f"train 224, batch {bs}, {workers} workers, {len(datasets['folder'])} images (best of rounds):")
    for name, r in best.items():
        print(f"  {name:9s} {r:7.0f} images/s  ({r / best['folder']:.2f}x the image folder)")
    print("  read() per sample in one process: " + ", ".join(f"{k} {v:.1f} us" for k, v in read_us.items()))
    for fmt, m in made.items():
        print(f"  convert folder -> {fmt}: {m['images_per_s']:.0f} images/s ({m['records']} images, no re-encoding)")
    report("bench_formats", args, {"images_per_s": best, "rounds": rates, "read_us": read_us,
                                   "convert_images_per_s": {k: m["images_per_s"] for k, m in made.items()}})


if __name__ == "__main__":
    main()
