"""The training feed: a ResNet step fed by fastload, by DataLoader at its best and by timm's
create_loader, against the model alone on a fixed GPU batch (the ceiling).

torchvision ResNet-50 and ResNet-18 (random init), bf16 autocast, channels_last, SGD,
batch 256, the same RandomResizedCrop(224) + flip and the same worker count (14) for
every loader:

- fastload default: ``fl.Loader(ImageList, transform=fl.transforms.train(224))``,
  normalized float32 channels_last batches on the GPU.
- DataLoader at its best: file bytes → ``torchvision.io.decode_jpeg`` → v2
  RandomResizedCrop (antialiased, on the uint8 tensor) + flip in the workers, uint8
  batches, pin_memory, persistent_workers; copied and normalized on the GPU in the loop.
- timm: ``create_loader(use_prefetcher=True)``: uint8 fast_collate, its PrefetchLoader
  (copy and normalization on a side stream).
- model alone: one normalized batch resident on the GPU, every step.

Runs are interleaved A B C D D C B A (each loader twice, made fresh and closed after);
every run is --warmup untimed steps, then --steps timed ones. An epoch is longer than a
run (the photo list repeated), so no run crosses an epoch end: no loader drains and
refills inside a timed run.

How a step is timed, the same for every loader (CUDA events on the training stream, no
synchronize inside the timed loop):
    batch = next(loader); batch.to(device, non_blocking=True)      # host: the loader's part
    event A recorded                                                # data ready on the GPU
    forward, backward, optimizer step
    event B recorded
Step i lasts B[i-1] → B[i] on the GPU; the GPU waited for data B[i-1] → A[i]: zero when the
host had queued the batch (its copy, its normalization, its stream wait) before the GPU
finished the previous step. Host time blocked in next() is reported besides.

--quick: the dry run on the CPU (ResNet-18 at 32 px, batch 4, 2 workers, perf_counter
marks instead of events), every loader included.
"""

from __future__ import annotations

import inspect
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
from common import machine, report
from gpu_common import (
    Clock,
    device_or_exit,
    feeding,
    gpu_parser,
    import_peers,
    jpeg_decoder,
    photos,
    read_bytes,
    repeat,
)

import fastload as fl
from fastload.config import IMAGENET_MEAN, IMAGENET_STD


def make_model(name: str, device: torch.device) -> nn.Module:
    import torchvision.models

    return getattr(torchvision.models, name)().to(device).to(memory_format=torch.channels_last)


def run_steps(batches: Iterator, net: nn.Module, device: torch.device, warmup: int, steps: int) -> dict:
    """``warmup`` untimed steps, then ``steps`` timed ones; see the module doc for the timing."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    clock = Clock(device)
    ready, done, host_wait, images = [], [], 0.0, 0
    for i in range(warmup + steps):
        asked = time.perf_counter()
        x, y = next(batches)[:2]
        x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        if i >= warmup:
            host_wait += time.perf_counter() - asked
            images += x.shape[0]
            ready.append(clock.mark())
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = net(x)
            loss = loss_fn(out, y % out.shape[1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup - 1:
            done.append(clock.mark())  # done[0]: the end of the last warm-up step
    clock.settle()
    step = [clock.seconds(done[k], done[k + 1]) for k in range(steps)]
    wait = [clock.seconds(done[k], ready[k]) for k in range(steps)]
    total = sum(step)
    return {"images_per_s": images / total, "wait_share": sum(wait) / total, "step_ms": 1e3 * statistics.median(step),
            "wait_ms": 1e3 * statistics.median(wait), "host_wait_share": host_wait / total, "steps": steps}


class DecodeJpegDataset(torch.utils.data.Dataset):
    """A DataLoader user's dataset at its best: bytes → decode_jpeg → v2 crop + flip, uint8 C×H×W."""

    def __init__(self, root: str, paths: list[str], labels: list[int], size: int, decode: Callable) -> None:
        from torchvision.transforms import v2

        self.root, self.paths, self.labels, self.decode = root, paths, labels, decode
        self.transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = self.decode(read_bytes(os.path.join(self.root, self.paths[i])))
        return self.transform(image), self.labels[i]


def normalized_on(device: torch.device, loader: Any) -> Iterator:
    """uint8 N×C×H×W batches copied to ``device`` and normalized there, as in the user's loop."""
    mean = 255 * torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = 255 * torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    for x, y in loader:
        x = x.to(device, non_blocking=True).float().sub_(mean).div_(std)
        yield x, y.to(device, non_blocking=True)


class Feeds:
    """Makers of each fed run's batches, on one photo set and its long epoch."""

    def __init__(self, args: Any, device: torch.device, bs: int, workers: int, size: int, epoch: int) -> None:
        self.args, self.device, self.bs, self.workers, self.size = args, device, bs, workers, size
        self.root, paths, labels = photos(args)
        self.paths, self.labels = repeat(paths, epoch), repeat(labels, epoch)
        self.torchvision, self.timm = import_peers(args.quick)
        self.decode = jpeg_decoder(self.torchvision, args.quick, os.path.join(self.root, paths[0]))

    def fastload(self) -> Any:
        ds = fl.ImageList.from_arrays(self.paths, self.labels, self.root, transform=fl.transforms.train(self.size))
        return fl.Loader(ds, batch_size=self.bs, shuffle=True, drop_last=True, num_workers=self.workers,
                         device=self.device, seed=0)

    def dataloader(self) -> Any:
        ds = DecodeJpegDataset(self.root, self.paths, self.labels, self.size, self.decode)
        return torch.utils.data.DataLoader(ds, batch_size=self.bs, shuffle=True, drop_last=True,
                                           num_workers=self.workers, pin_memory=self.device.type == "cuda",
                                           persistent_workers=True)

    def timm_loader(self) -> Any:
        """create_loader with its prefetcher, augmentation cut to crop + flip (no colour jitter)."""
        ds = self.timm.data.ImageDataset(self.root)
        ds.reader.samples = repeat(ds.reader.samples, len(self.paths))
        options = dict(input_size=(3, self.size, self.size), batch_size=self.bs, is_training=True, use_prefetcher=True,
                       scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, color_jitter=0.0, re_prob=0.0,
                       interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD, num_workers=self.workers,
                       pin_memory=self.device.type == "cuda", persistent_workers=True, device=self.device)
        accepted = inspect.signature(self.timm.data.create_loader).parameters
        return self.timm.data.create_loader(ds, **{k: v for k, v in options.items() if k in accepted})

    def makers(self) -> dict[str, Callable[[], tuple[Any, Iterator]]]:
        """Label → a function making (loader or None, its batches)."""

        def fastload():
            loader = self.fastload()
            return loader, iter(loader)

        def dataloader():
            loader = self.dataloader()
            return loader, normalized_on(self.device, loader)

        def timm_loader():
            loader = self.timm_loader()
            return loader, iter(loader)

        def alone():
            g = torch.Generator().manual_seed(0)
            x = torch.randn(self.bs, 3, self.size, self.size, generator=g).to(self.device)
            y = torch.randint(0, 1000, (self.bs,), generator=g).to(self.device)
            return None, itertools.repeat((x.contiguous(memory_format=torch.channels_last), y))

        return {"fastload": fastload, "DataLoader best": dataloader, "timm create_loader": timm_loader,
                "model alone": alone}


def bench_model(name: str, feeds: Feeds, warmup: int, steps: int) -> dict:
    """Every feed on model ``name`` in the order A B C D D C B A; each run's record as it ends."""
    net = make_model(name, feeds.device)
    makers = feeds.makers()
    order = list(makers) + list(reversed(makers))
    runs: dict[str, list[dict]] = {label: [] for label in makers}
    for label in order:
        with feeding(*makers[label]()) as batches:
            result = run_steps(batches, net, feeds.device, warmup, steps)
        runs[label].append(result)
        report("bench_gpu_train_run", feeds.args, {"model": name, "loader": label, **result})
    return {label: {**mean_run(r), "runs": r} for label, r in runs.items()}


def mean_run(runs: list[dict]) -> dict:
    keys = ("images_per_s", "wait_share", "step_ms", "wait_ms", "host_wait_share")
    return {k: statistics.fmean(r[k] for r in runs) for k in keys}


def print_model(name: str, results: dict, bs: int, workers: int, where: str) -> None:
    peers = [r["images_per_s"] for k, r in results.items() if k not in ("fastload", "model alone")]
    best_peer = max(peers) if peers else None
    print(f"{name}, bf16 autocast, channels_last, batch {bs}, {workers} workers each, on {where}:")
    print(f"  {'feed':20s} {'images/s':>9s} {'data wait':>9s} {'step ms':>8s} {'wait ms':>8s} {'host wait':>9s} "
          f"{'vs best peer':>12s}")
    for label, r in results.items():
        ratio = f"{r['images_per_s'] / best_peer:11.2f}x" if best_peer else f"{'-':>12s}"
        print(f"  {label:20s} {r['images_per_s']:9.0f} {r['wait_share']:9.1%} {r['step_ms']:8.1f} "
              f"{r['wait_ms']:8.2f} {r['host_wait_share']:9.1%} {ratio}")


def arguments() -> Any:
    p = gpu_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=40, help="timed steps per run (default: 40)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first in each run (default: 2 per worker: the batches the workers' first "
                        "rounds make at once are behind)")
    p.add_argument("--models", default="resnet50,resnet18", help="torchvision model names, comma-separated")
    return p


def sizes(args: Any) -> dict:
    """Batch, steps, workers, image size, models, and the epoch (samples): twice the batches a
    run takes and its workers hold, so every run ends long before its epoch does."""
    if args.quick:
        bs, warmup, steps, workers, size, models = 4, 1, 2, 2, 32, ["resnet18"]
    else:
        bs, steps, workers, size = args.batch_size, args.steps, args.workers, 224
        warmup = 2 * workers if args.warmup is None else args.warmup
        models = [m.strip() for m in args.models.split(",") if m.strip()]
    return {"batch": bs, "warmup": warmup, "steps": steps, "workers": workers, "size": size, "models": models,
            "epoch": 2 * (warmup + steps + 2 * workers) * bs}


def main() -> None:
    args = arguments().parse_args()
    device = device_or_exit(args, "bench_gpu_train")
    s = sizes(args)
    bs, warmup, steps, workers = s["batch"], s["warmup"], s["steps"], s["workers"]
    feeds = Feeds(args, device, bs, workers, s["size"], s["epoch"])
    torch.backends.cudnn.benchmark = True
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "the CPU (dry run)"
    for name in s["models"]:
        results = bench_model(name, feeds, warmup, steps)
        print_model(name, results, bs, workers, where)
        report("bench_gpu_train", args, {"results": {name: results}, "batch_size": bs, "workers": workers,
                                         "steps": steps, "warmup": warmup, "epoch_batches": len(feeds.paths) // bs,
                                         "photos": feeds.root, "device": machine()})
    print(f"(mean of 2 runs of {steps} steps after {warmup} warm-up steps, order A B C D D C B A; step = GPU time "
          f"between the ends of consecutive steps; data wait = from the end of the previous step to the batch being "
          f"ready on the training stream; host wait = time blocked in next())")


if __name__ == "__main__":
    main()
