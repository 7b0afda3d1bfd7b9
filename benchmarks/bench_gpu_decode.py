"""GPU decode against the CPU default, and timm's recipe with its batch stage on the device.

1. ``decode="gpu"`` against ``decode="cpu"`` (the default): RandomResizedCrop(224) + flip,
   normalized float batches of 256 on the GPU, 14 workers each. CPU: the workers decode,
   crop, resize and flip. GPU: the workers read bytes and draw crops; the batch is decoded
   (nvImageCodec: nvJPEG, the GPU's hardware decoder where it has one), cropped, resized,
   flipped and normalized on the GPU. Timed: --per-worker batches for every worker (20:
   every worker works, start-up is behind) after 2 per worker of warm-up.
2. timm's ImageNet recipe (rand-m9-mstd0.5-inc1, RandomErasing 0.25 "pixel", Mixup 0.8 /
   CutMix 1.0, label smoothing 0.1): fastload (RandAugment in the workers, RandomErasing and
   Mixup on the GPU as its batch stage) against timm's create_loader with its prefetcher
   and FastCollateMixup (its train.py's GPU path). Timed: 5 batches per worker.

Runs are fresh loaders, order A B B A; the epoch is the photo list repeated, longer than a
run. The mean of the two runs of each is reported, with both. One JSON record when the
decode part ends, and one with both parts at the end. --quick: the dry run on the
CPU, decode="gpu" on nvImageCodec's CPU backend (``FASTLOAD_GPU_DECODE_ON_CPU=1``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_recipe import AA, _timm  # _timm: timm.data with its posterize fixed for Pillow >= 10
from common import report
from gpu_common import device_or_exit, feeding, gpu_parser, import_peers, photos, repeat, sync

import fastload as fl
from fastload.config import IMAGENET_MEAN, IMAGENET_STD


def rate(make: Callable[[], Any], warmup: int, timed: int, device: torch.device) -> float:
    """images/s of ``timed`` batches after ``warmup``, the device's queued work included."""
    with feeding(make()) as batches:
        for _ in range(warmup):
            next(batches)
        sync(device)
        start, images = time.perf_counter(), 0
        for _ in range(timed):
            images += next(batches)[0].shape[0]
        sync(device)
        return images / (time.perf_counter() - start)


def abba(makers: dict[str, Callable[[], Any]], warmup: int, timed: int, device: torch.device) -> dict:
    a, b = makers
    runs: dict[str, list[float]] = {a: [], b: []}
    for name in (a, b, b, a):
        runs[name].append(rate(makers[name], warmup, timed, device))
        print(f"  {name}: {runs[name][-1]:.0f} images/s", flush=True)
    return {name: {"images_per_s": statistics.fmean(r), "runs": r} for name, r in runs.items()}


def timm_recipe(data: Any, root: str, n: int, bs: int, workers: int, classes: int, device: torch.device) -> Any:
    """timm's create_loader + FastCollateMixup, as its train.py runs the recipe on a GPU."""
    ds = data.ImageDataset(root)
    ds.reader.samples = repeat(ds.reader.samples, n)
    mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=classes)
    return data.create_loader(
        ds, input_size=(3, 224, 224), batch_size=bs, is_training=True, use_prefetcher=True, re_prob=0.25,
        re_mode="pixel", re_count=1, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, color_jitter=0.4,
        auto_augment=AA, interpolation="random", mean=IMAGENET_MEAN, std=IMAGENET_STD, num_workers=workers,
        collate_fn=data.FastCollateMixup(**mix), pin_memory=device.type == "cuda", persistent_workers=True,
        device=device)


def arguments() -> Any:
    p = gpu_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--per-worker", type=int, default=20, help="timed decode batches per worker (default: 20)")
    p.add_argument("--recipe-per-worker", type=int, default=5, help="timed recipe batches per worker (default: 5)")
    return p


def sizes(args: Any) -> dict:
    """Batch, workers, warm-up and timed batches of each part, and the epoch (samples): every
    worker makes --per-worker timed batches after 2 of warm-up, within one epoch."""
    if args.quick:
        bs, workers, per_worker, recipe_per_worker = 8, 2, 2, 1
    else:
        bs, workers, per_worker, recipe_per_worker = (args.batch_size, args.workers, args.per_worker,
                                                      args.recipe_per_worker)
    warmup, timed, recipe_timed = 2 * workers, per_worker * workers, recipe_per_worker * workers
    return {"batch": bs, "workers": workers, "warmup": warmup, "timed": timed, "recipe_timed": recipe_timed,
            "epoch": (warmup + max(timed, recipe_timed) + 4 * workers) * bs}


def main() -> None:
    args = arguments().parse_args()
    device = device_or_exit(args, "bench_gpu_decode")
    if device.type != "cuda":
        os.environ["FASTLOAD_GPU_DECODE_ON_CPU"] = "1"
    root, paths, labels = photos(args)
    classes = max(labels) + 1
    size = sizes(args)
    bs, workers, warmup, timed, n = size["batch"], size["workers"], size["warmup"], size["timed"], size["epoch"]
    per_worker = timed // workers
    paths, labels = repeat(paths, n), repeat(labels, n)
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "the CPU (dry run)"

    def fastload(decode: str = "cpu", recipe: bool = False) -> Callable[[], fl.Loader]:
        tf = fl.transforms.train(224, auto_augment=AA if recipe else None)
        stage = [fl.augment.RandomErasing(0.25, mode="pixel", device=device),
                 fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=classes)]
        ds = fl.ImageList.from_arrays(paths, labels, root, transform=tf)
        return lambda: fl.Loader(ds, batch_size=bs, num_workers=workers, shuffle=True, drop_last=True, device=device,
                                 seed=0, decode=decode, batch_transform=stage if recipe else None)

    print(f"decode: {len(set(paths))} photos, RandomResizedCrop(224) + flip + normalize, batch {bs}, {workers} "
          f"workers, on {where}; {timed} timed batches ({per_worker} per worker) after {warmup}:")
    decode = abba({"cpu": fastload("cpu"), "gpu": fastload("gpu")}, warmup, timed, device)
    ratio = decode["gpu"]["images_per_s"] / decode["cpu"]["images_per_s"]
    print(f"  decode='gpu' / decode='cpu': {ratio:.2f}x (target >= 2x)")
    result = {"decode": decode, "gpu_vs_cpu": ratio, "batch_size": bs, "workers": workers, "timed_batches": timed,
              "warmup_batches": warmup, "photos": root}
    report("bench_gpu_decode", args, result)  # now: a run stopped in the recipe part keeps it

    import_peers(args.quick)  # torchvision's own, before _timm stubs its compiled ops for the dry run
    data = _timm()
    recipe_timed = size["recipe_timed"]
    print(f"timm recipe: batch {bs}, {workers} workers, batch stage on {device.type}; {recipe_timed} timed batches "
          f"after {warmup}:")
    recipe = abba({"fastload": fastload("cpu", recipe=True),
                   "timm": lambda: timm_recipe(data, root, n, bs, workers, classes, device)},
                  warmup, recipe_timed, device)
    recipe_ratio = recipe["fastload"]["images_per_s"] / recipe["timm"]["images_per_s"]
    print(f"  fastload / timm prefetcher + FastCollateMixup: {recipe_ratio:.2f}x")
    report("bench_gpu_decode", args, {**result, "recipe": recipe, "fastload_vs_timm": recipe_ratio,
                                      "recipe_timed_batches": recipe_timed})


if __name__ == "__main__":
    main()
