"""Bring your own dataset: a PIL dataset in a plain DataLoader, the same dataset in
``fl.Loader``, and fastload's ImageFolder over the same files, on the photo set.

Training preset (RandomResizedCrop 224 + flip), float32 normalized output on the CPU
(what the classic pipeline hands over):

* "DataLoader, PIL dataset": torchvision-style ``__getitem__`` (Pillow RandomResizedCrop,
  flip, ToTensor, Normalize) in a ``torch.utils.data.DataLoader`` (``peers.ClassicDataset``);
* "fl.Loader, the same PIL dataset": the dataset without ToTensor/Normalize (uint8
  C×H×W items, ``peers.TimmDataset``) wrapped by ``fl.Loader`` (``WrappedDataset``),
  which collates and normalizes;
* "fl.ImageFolder": ``fl.ImageFolder(root, transform=fl.transforms.train(224))``.

The fastload rows run with both backends. One epoch per pipeline per round after a
warm-up epoch, rounds interleaved; median (range). docs/guides/datasets.md's "Your own Dataset"
quotes this benchmark.
"""

from __future__ import annotations

import glob
import os
import time

import torch
from common import loader_parser, median, photo_folder, photo_set_record, report
from peers import ClassicDataset, TimmDataset

import fastload as fl


def epoch_rate(batches) -> float:
    start, images = time.perf_counter(), 0
    for batch in batches:
        images += batch[0].shape[0]
    return images / (time.perf_counter() - start)


def main() -> None:
    p = loader_parser(__doc__)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    root = photo_folder(args)
    rounds, bs, workers = (1, 8, 2) if args.quick else (args.rounds, args.batch_size, args.workers)
    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    classes = sorted(os.listdir(root))
    labels = [classes.index(os.path.basename(os.path.dirname(q))) for q in paths]
    pipelines = {"DataLoader, PIL dataset (ToTensor + Normalize in __getitem__)": torch.utils.data.DataLoader(
        ClassicDataset(paths, labels, True), batch_size=bs, num_workers=workers, shuffle=True,
        persistent_workers=True)}
    for backend in ("process", "thread"):
        pipelines[f"fl.Loader, the same PIL dataset (uint8 items), {backend}"] = fl.Loader(
            TimmDataset(paths, labels, True), batch_size=bs, num_workers=workers, shuffle=True, backend=backend,
            device="cpu")
    for backend in ("process", "thread"):
        pipelines[f"fl.ImageFolder, fl.transforms.train(224), {backend}"] = fl.Loader(
            fl.ImageFolder(root, transform=fl.transforms.train(224)), batch_size=bs, num_workers=workers,
            shuffle=True, backend=backend, device="cpu")
    for batches in pipelines.values():  # warm-up: workers started
        epoch_rate(batches)
    runs: dict = {name: [] for name in pipelines}
    for r in range(1, rounds + 1):
        for name, batches in pipelines.items():
            if isinstance(batches, fl.Loader):
                batches.set_epoch(r)
            runs[name].append(epoch_rate(batches))
    for batches in pipelines.values():
        if isinstance(batches, fl.Loader):
            batches.close()
    med = {name: median(v) for name, v in runs.items()}
    base = next(iter(med.values()))
    print(f"train 224 + flip, float32 normalized on the CPU, {len(paths)} photos, batch {bs}, {workers} workers, "
          f"median of {rounds} interleaved rounds (range):")
    for name, rate in med.items():
        print(f"  {name:66s} {rate:6.0f} ({min(runs[name]):.0f}–{max(runs[name]):.0f})  {rate / base:.2f}x")
    report("bench_wrap", args, {"images_per_s": med, "rounds": runs, "batch_size": bs, "workers": workers,
                                "dataset": photo_set_record(root)})


if __name__ == "__main__":
    main()
