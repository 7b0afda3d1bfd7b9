"""timm's ImageNet training recipe end to end: fastload against timm's own loader, real photos.

The recipe: RandomResizedCrop 224 + horizontal flip, ``rand-m9-mstd0.5-inc1`` RandAugment,
RandomErasing 0.25 ("pixel"), Mixup 0.8 / CutMix 1.0 with label smoothing 0.1; 2 workers,
batch 128, float32 normalized N×C×H×W images and soft targets out, on the CPU.

- fastload: ``fl.transforms.train(224, auto_augment=...)`` in the workers,
  ``batch_transform=[fl.augment.Mixup(...), fl.augment.RandomErasing(...)]`` on the batch
  (timm's prefetcher order: mixed, then erased; the runs recorded before issue 32 erased first).
- timm: its real ``timm.data.create_loader`` with the same arguments (``re_prob``,
  ``re_mode``, ``auto_augment``, ``interpolation="random"``, ``color_jitter=0.4``: skipped
  under RandAugment as in timm) and its ``Mixup``, both ways its train.py runs them:
  ``use_prefetcher=False`` (per-sample ToTensor, Normalize, RandomErasing in the workers;
  ``Mixup`` on the batch in the main process) and ``use_prefetcher=True`` (uint8 batches,
  ``FastCollateMixup`` in the workers, normalization and RandomErasing in the main process
  by its PrefetchLoader, here on the CPU). The ratio is to the faster of the two.
- fastload crop + flip: the same Loader without the recipe: the recipe's cost is
  ``1 - recipe / crop+flip``. The recipe's per-sample part alone (RandAugment in the
  workers, no batch stage) shows how the cost splits: on the CPU the batch stage
  (normalized float batches, RandomErasing and Mixup in the main process, beside the
  workers) is most of it; with a GPU it runs there.

timm 1.0.31 with Pillow >= 10 fails on this recipe: ``PosterizeIncreasing`` at magnitude 10
(mstd noise reaches it for ~2% of its draws) asks Pillow for 0 bits, which Pillow now refuses
(ValueError). Its ``posterize`` is replaced here by the same LUT with 0 bits allowed (what
older Pillow did, a black image; what fastload does), the same cost.

Pipelines run one epoch each in turn, ABBA order, for ``--rounds`` rounds after a warm-up
epoch; medians are reported with the range, by wall time and by CPU time (main process and
workers: on a busy machine the CPU rates measure each pipeline's own work).
"""

from __future__ import annotations

import os
import sys
import time

import torch
from common import loader_parser, median, photo_folder, report, tree_cpu_seconds

import fastload as fl
from fastload.system import available_cpus

AA = "rand-m9-mstd0.5-inc1"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SETTLE = 0.5


def _timm():
    """timm.data with its posterize fixed for Pillow >= 10 (see above), or None without timm."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import refs  # noqa: PLC0415  (stubs torchvision's compiled ops so timm imports)

    refs.stub_meta_registrations()
    try:
        import timm.data  # noqa: PLC0415
    except ImportError:
        return None
    from PIL import ImageOps  # noqa: PLC0415
    from timm.data import auto_augment  # noqa: PLC0415

    def posterize(img, bits_to_keep, **__):
        if bits_to_keep >= 8:
            return img
        mask = ~(2 ** (8 - bits_to_keep) - 1) & 0xFF
        return img.point([i & mask for i in range(256)] * len(img.getbands())) if bits_to_keep < 1 \
            else ImageOps.posterize(img, bits_to_keep)

    for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        auto_augment.NAME_TO_OP[name] = posterize
    return timm.data


def fastload_loader(root: str, bs: int, workers: int, recipe: bool, batch_stage: bool = True) -> fl.Loader:
    """The recipe (``batch_stage=False``: its per-sample part only), or crop + flip."""
    tf = fl.transforms.train(224, auto_augment=AA if recipe else None, interpolation="random")
    ds = fl.ImageFolder(root, transform=tf)
    batch = [fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=len(ds.classes)),
             fl.augment.RandomErasing(0.25, mode="pixel", device="cpu")]
    return fl.Loader(ds, batch_size=bs, num_workers=workers, shuffle=True, drop_last=True, device="cpu",
                     normalize=fl.Normalize(mean=MEAN, std=STD), seed=0, batch_transform=batch if recipe and batch_stage else None)


class TimmRecipe:
    """timm's create_loader + Mixup as its train.py uses them (``prefetcher``: its default on GPU)."""

    def __init__(self, data, root: str, bs: int, workers: int, prefetcher: bool) -> None:
        ds = data.ImageDataset(root)
        n = len({t for _, t in ds.reader.samples})
        mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=n)
        self.mixup = None if prefetcher else data.Mixup(**mix)
        self.loader = data.create_loader(
            ds, input_size=(3, 224, 224), batch_size=bs, is_training=True, use_prefetcher=prefetcher,
            re_prob=0.25, re_mode="pixel", re_count=1, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5,
            color_jitter=0.4, auto_augment=AA, interpolation="random", mean=MEAN, std=STD, num_workers=workers,
            collate_fn=data.FastCollateMixup(**mix) if prefetcher else None, persistent_workers=True,
            device=torch.device("cpu"))

    def __iter__(self):
        for x, y in self.loader:
            if self.mixup is not None:
                x, y = self.mixup(x, y)
            yield x, y


def per_image_ms(root: str, data, rounds: int, quick: bool) -> dict:
    """One core, CPU time per 224×224 image of the recipe's per-sample augmentation alone:
    fastload's on arrays against timm's on PIL images (rounds interleaved; median)."""
    import glob  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))[: 16 if quick else 200]
    arrays = [np.asarray(Image.open(p).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)) for p in paths]
    pils = [Image.fromarray(a) for a in arrays]
    ours, rng = fl.transforms.timm_augment(AA, 224), np.random.default_rng(0)
    runs: dict = {"fastload": []}
    if data is not None:
        theirs = data.auto_augment.rand_augment_transform(AA, {"translate_const": int(224 * 0.45),
                                                               "img_mean": (124, 116, 104)})
        runs["timm (Pillow)"] = []
    for _ in range(rounds):
        start = time.process_time()
        for a in arrays:
            ours(a, rng)
        runs["fastload"].append((time.process_time() - start) / len(arrays) * 1e3)
        if data is not None:
            start = time.process_time()
            for p in pils:
                theirs(p)
            runs["timm (Pillow)"].append((time.process_time() - start) / len(pils) * 1e3)
    med = {k: median(v) for k, v in runs.items()}
    print(f"\n{AA} alone, one core, CPU ms per 224x224 image (median of {rounds} rounds over {len(arrays)} photos)")
    for k, v in runs.items():
        print(f"  {k:20s} {med[k]:6.3f}  [{min(v):.3f}, {max(v):.3f}]")
    if data is not None:
        print(f"  timm / fastload: {med['timm (Pillow)'] / med['fastload']:.2f}x")
    return med


def epoch_rate(batches, soft: bool) -> tuple[float, float]:
    """(images/s, images per CPU-second of this process and its workers) of one pass."""
    time.sleep(SETTLE)
    start, cpu, images = time.perf_counter(), tree_cpu_seconds(), 0
    for x, y in batches:
        if x.dtype != torch.float32 or (y.dim() == 2) != soft:
            raise AssertionError(f"unexpected batch: images {x.dtype}, targets {tuple(y.shape)}")
        images += x.shape[0]
    return images / (time.perf_counter() - start), images / max(tree_cpu_seconds() - cpu, 1e-3)


def main() -> None:
    p = loader_parser(__doc__)
    p.set_defaults(batch_size=128, workers=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    root = photo_folder(args)
    rounds = 1 if args.quick else args.rounds
    bs = 16 if args.quick else args.batch_size
    data = _timm()
    per_image = per_image_ms(root, data, rounds, args.quick)
    pipelines = {
        "fastload recipe": fastload_loader(root, bs, args.workers, True),
        "fastload crop+flip": fastload_loader(root, bs, args.workers, False),
        "fastload recipe, per-sample part only": fastload_loader(root, bs, args.workers, True, batch_stage=False),
    }
    if data is None:
        print("timm: not installed (a benchmark-only peer: `make test` installs it); fastload rows only")
    else:
        pipelines["timm create_loader + Mixup (use_prefetcher=False)"] = TimmRecipe(data, root, bs, args.workers, False)
        pipelines["timm create_loader + FastCollateMixup (use_prefetcher=True)"] = TimmRecipe(
            data, root, bs, args.workers, True)
    hard = (pipelines["fastload crop+flip"], pipelines["fastload recipe, per-sample part only"])
    for batches in pipelines.values():
        epoch_rate(batches, soft=batches not in hard)  # warm-up: workers started
    runs: dict = {name: [] for name in pipelines}
    for r in range(1, rounds + 1):
        order = list(pipelines.items())
        for name, batches in order if r % 2 else order[::-1]:  # ABBA: drift hits all alike
            if isinstance(batches, fl.Loader):
                batches.set_epoch(r)
            runs[name].append(epoch_rate(batches, soft=batches not in hard))
    results = {}
    for k, unit in enumerate(("images/s", "images per CPU-second")):
        med = {name: median([v[k] for v in rs]) for name, rs in runs.items()}
        print(f"\n{unit} (median of {rounds} rounds, [min, max])")
        for name, rs in runs.items():
            vals = [v[k] for v in rs]
            print(f"  {name:62s} {med[name]:8.1f}  [{min(vals):.1f}, {max(vals):.1f}]")
        timm_rows = [n for n in med if n.startswith("timm")]
        timm_best = max(timm_rows, key=med.get) if timm_rows else None
        ratio = med["fastload recipe"] / med[timm_best] if timm_best else float("nan")
        cost = 1 - med["fastload recipe"] / med["fastload crop+flip"]
        sample_cost = 1 - med["fastload recipe, per-sample part only"] / med["fastload crop+flip"]
        print(f"  fastload recipe / {timm_best}: {ratio:.2f}x (target >= 2.5x)")
        print(f"  recipe cost vs fastload crop+flip: {cost:.0%} (target <= 30%); its per-sample part alone: "
              f"{sample_cost:.0%}")
        results[unit] = {"median": med, "ratio_to_timm": ratio, "timm_best": timm_best, "cost": cost,
                         "per_sample_cost": sample_cost}
    print(f"({len(pipelines['fastload recipe'].dataset)} photos, batch {bs}, {args.workers} workers on "
          f"{available_cpus()} CPUs, one epoch per pipeline per round after a warm-up epoch)")
    for batches in pipelines.values():
        if isinstance(batches, fl.Loader):
            batches.close()
    report("bench_recipe", args, {"results": results, "rounds": runs, "per_image_ms": per_image})


if __name__ == "__main__":
    main()
