"""Multi-view (SSL) loading: DINO's multi-crop with fastload against torchvision on PIL, on the photo set.

Per image, 2 global views (RandomResizedCrop 224, scale (0.4, 1)) and 8 local views (96,
scale (0.05, 0.4)), float32 normalized N×C×H×W per view on the CPU, batched as a list of
10 tensors:

* "torchvision, PIL": DINO's own ``DataAugmentationDINO`` as its ``main_dino.py`` writes it,
  with torchvision's transforms on PIL images (bilinear, torchvision's default and its
  fastest; DINO asks for bicubic) in ``torch.utils.data.DataLoader`` (default_collate);
* "fastload": ``fl.Loader(fl.ImageFolder(root, transform=...))``, the same views from one
  planned decode per image (process and thread backends).

Two recipes: ``geometry`` (crops and flips only) and ``dino`` (plus colour jitter,
grayscale, blur and solarize: ``fl.transforms.dino()``; needs ``fastload.transforms.color``).
One epoch per pipeline per round after a warm-up epoch, rounds in alternating order;
medians of images/s (10 views each) and of images per CPU-second (main process and workers).
"""

from __future__ import annotations

import glob
import os
import random
import sys
import time
import types

import torch
from common import loader_parser, median, photo_folder, photo_set_record, report, tree_cpu_seconds
from peers import pil_loader

import fastload as fl
from fastload.config import IMAGENET_MEAN, IMAGENET_STD

GLOBAL, LOCAL = (0.4, 1.0), (0.05, 0.4)


def torchvision_transforms():
    # The PyPI wheel is a CUDA build installed --no-deps: its compiled ops' meta kernels are not needed here.
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    from torchvision import transforms

    return transforms


class DinoPIL:
    """DINO's ``DataAugmentationDINO`` (``colour=False``: its crops and flips only)."""

    def __init__(self, n_local: int, colour: bool) -> None:
        from PIL import ImageFilter, ImageOps

        t = torchvision_transforms()
        self.n_local = n_local

        def blur(p: float):
            def f(img):
                if random.random() >= p:
                    return img
                return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))
            return f

        def solarize(p: float):
            return lambda img: ImageOps.solarize(img) if random.random() < p else img

        jitter = [t.RandomApply([t.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8), t.RandomGrayscale(p=0.2)] if colour else []
        norm = [t.ToTensor(), t.Normalize(IMAGENET_MEAN, IMAGENET_STD)]

        def view(size, scale, extra):
            return t.Compose([t.RandomResizedCrop(size, scale=scale), t.RandomHorizontalFlip(), *jitter,
                              *(extra if colour else []), *norm])

        self.global1 = view(224, GLOBAL, [blur(1.0)])
        self.global2 = view(224, GLOBAL, [blur(0.1), solarize(0.2)])
        self.local = view(96, LOCAL, [blur(0.5)])

    def __call__(self, img):
        return [self.global1(img), self.global2(img)] + [self.local(img) for _ in range(self.n_local)]


class PILFolder(torch.utils.data.Dataset):
    def __init__(self, paths: list[str], labels: list[int], transform) -> None:
        self.paths, self.labels, self.transform = paths, labels, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return self.transform(pil_loader(self.paths[i])), self.labels[i]


def fastload_transform(recipe: str, n_local: int):
    if recipe == "dino":
        return fl.transforms.dino(n_local=n_local)
    return fl.transforms.MultiView([fl.transforms.train(224, scale=GLOBAL), fl.transforms.train(96, scale=LOCAL)],
                                   counts=[2, n_local])


def epoch(batches) -> tuple[int, float, float]:
    """(images, wall s, CPU s of this process and its workers) of one epoch."""
    cpu, start, images = tree_cpu_seconds(), time.perf_counter(), 0
    for views, _ in batches:
        images += views[0].shape[0]
    return images, time.perf_counter() - start, tree_cpu_seconds() - cpu


def main() -> None:
    p = loader_parser(__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local", type=int, default=8, help="local views per image")
    p.add_argument("--recipe", choices=["geometry", "dino"], default="geometry")
    args = p.parse_args()
    root = photo_folder(args)
    rounds, bs, workers = (1, 8, 2) if args.quick else (args.rounds, args.batch_size, args.workers)
    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    classes = sorted(os.listdir(root))
    labels = [classes.index(os.path.basename(os.path.dirname(q))) for q in paths]
    colour = args.recipe == "dino"
    pipelines = {"torchvision, PIL (DataLoader)": torch.utils.data.DataLoader(
        PILFolder(paths, labels, DinoPIL(args.local, colour)), batch_size=bs, num_workers=workers, shuffle=True,
        persistent_workers=True)}
    for backend in ("process", "thread"):
        pipelines[f"fastload, {backend}"] = fl.Loader(
            fl.ImageFolder(root, transform=fastload_transform(args.recipe, args.local)), batch_size=bs,
            num_workers=workers, shuffle=True, backend=backend, device="cpu")
    print(f"recipe {args.recipe}: 2 x 224 + {args.local} x 96 views, batch {bs}, {workers} workers, "
          f"{len(paths)} photos, {rounds} rounds")
    for batches in pipelines.values():  # warm-up: workers started, caches filled
        epoch(batches)
    rates: dict[str, list[float]] = {k: [] for k in pipelines}
    per_cpu: dict[str, list[float]] = {k: [] for k in pipelines}
    for r in range(rounds):
        order = list(pipelines) if r % 2 == 0 else list(reversed(pipelines))
        for name in order:
            images, wall, cpu = epoch(pipelines[name])
            rates[name].append(images / wall)
            per_cpu[name].append(images / cpu)
            print(f"  round {r} {name}: {images / wall:.1f} images/s, {images / cpu:.1f} images per CPU-s", flush=True)
    base = "torchvision, PIL (DataLoader)"
    print(f"{'pipeline':<32} {'images/s':>9} {'x peer':>7} {'img/CPU-s':>10} {'x peer':>7}")
    for name in pipelines:
        a, c = median(rates[name]), median(per_cpu[name])
        print(f"{name:<32} {a:>9.1f} {a / median(rates[base]):>7.2f} {c:>10.1f} {c / median(per_cpu[base]):>7.2f}")
    for batches in pipelines.values():
        if hasattr(batches, "close"):
            batches.close()
    report("bench_multiview", args, {"recipe": args.recipe, "local": args.local, "batch_size": bs, "workers": workers,
                               "photos": photo_set_record(root),
                               "images_per_s": {k: median(v) for k, v in rates.items()},
                               "images_per_cpu_s": {k: median(v) for k, v in per_cpu.items()}})


if __name__ == "__main__":
    main()
