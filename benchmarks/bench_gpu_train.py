"""A training step fed by fastload (both backends), by DataLoader + torchvision transforms
+ pin_memory, and by timm's create_loader: images/s and the share of the GPU's time spent
waiting for data, on the real-photo set, in one interleaved run.

torchvision ResNet-50 and ResNet-18, channels_last, bf16 autocast, SGD, batch 256, the
same RandomResizedCrop(224) + flip for every loader, the same worker count for every
loader. Each loader runs --rounds times, in turn, after --warmup steps per run; the
median run is reported.

How a step is timed, the same way for every loader (CUDA events on the training stream,
no synchronize inside the timed loop):
    batch = next(loader); batch.to(device, non_blocking=True)      # host: the loader's part
    event A recorded                                                # data ready on the GPU
    forward, backward, optimizer step
    event B recorded
Step i lasts B[i-1] → B[i] on the GPU; the GPU waited for data B[i-1] → A[i]: zero when the
host had queued the batch (its copy, its normalization, its stream wait) before the GPU
finished the previous step, else the time the GPU sat idle or copying on the training
stream. Host-side time blocked in next() is reported besides.

Needs CUDA for a real run; --quick runs a tiny model on the CPU through the same code
(perf_counter marks instead of events); the peers need torchvision / timm and are
skipped, with a message, where those do not import.
"""

from __future__ import annotations

import gc
import inspect
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
from common import machine, parser, photo_folder, photo_set_record, report

import fastload as fl
from fastload.config import IMAGENET_MEAN, IMAGENET_STD
from fastload.system import available_cpus


class Clock:
    """Marks on the training stream (CUDA events), or host time where there is no GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the current (training) stream
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def settle(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # once, after the timed loop: events are read back


def tiny_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


def make_model(name: str, device: torch.device) -> nn.Module:
    if name == "tiny":
        net = tiny_model()
    else:
        import torchvision.models

        net = getattr(torchvision.models, name)()
    return net.to(device).to(memory_format=torch.channels_last)


def forever(loader) -> Iterator:
    """Batches of pass after pass (each a new epoch), as a training loop takes them."""
    while True:
        yield from loader


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


def fastload_loader(root: str, bs: int, workers: int, device: torch.device, backend: str):
    ds = fl.ImageFolder(root, transform=fl.transforms.train(224))
    return fl.Loader(ds, batch_size=bs, shuffle=True, drop_last=True, num_workers=workers, device=device,
                     backend=backend)


def torchvision_loader(root: str, bs: int, workers: int, device: torch.device):
    """What the torchvision ImageNet example writes: ImageFolder, PIL transforms,
    DataLoader with pin_memory; the copy happens in the training loop."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    return torch.utils.data.DataLoader(ImageFolder(root, tf), batch_size=bs, shuffle=True, drop_last=True,
                                       num_workers=workers, pin_memory=device.type == "cuda",
                                       persistent_workers=workers > 0)


def timm_loader(root: str, bs: int, workers: int, device: torch.device):
    """timm's create_loader at its fastest: uint8 fast_collate, its CUDA prefetcher
    (copy and normalization on a side stream), pinned memory, workers kept across
    epochs; augmentation cut to the same RandomResizedCrop + flip (no colour jitter)."""
    from timm.data import ImageDataset, create_loader

    options = dict(input_size=(3, 224, 224), batch_size=bs, is_training=True, use_prefetcher=True,
                   color_jitter=0.0, re_prob=0.0, hflip=0.5, interpolation="bilinear", num_workers=workers,
                   pin_memory=True, use_multi_epochs_loader=True, persistent_workers=True,
                   mean=IMAGENET_MEAN, std=IMAGENET_STD, device=device)
    accepted = inspect.signature(create_loader).parameters
    return create_loader(ImageDataset(root), **{k: v for k, v in options.items() if k in accepted})


def loaders(root: str, bs: int, workers: int, device: torch.device) -> dict[str, Callable]:
    """Name → a function making that loader; peers that cannot run here are left out, said why."""
    made: dict[str, Callable] = {
        "fastload process": lambda: fastload_loader(root, bs, workers, device, "process"),
        "fastload thread": lambda: fastload_loader(root, bs, workers, device, "thread"),
    }
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision without its compiled ops
        print(f"DataLoader + torchvision peer skipped: torchvision does not import here ({e})")
    else:
        made["DataLoader + torchvision"] = lambda: torchvision_loader(root, bs, workers, device)
    try:
        import timm  # noqa: F401
    except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision without its compiled ops
        print(f"timm create_loader peer skipped: timm does not import here ({e})")
    else:
        if device.type == "cuda":
            made["timm create_loader"] = lambda: timm_loader(root, bs, workers, device)
        else:
            print("timm create_loader peer skipped: its prefetcher needs CUDA")
    return made


def bench_model(name: str, makers: dict, device: torch.device, warmup: int, steps: int, rounds: int) -> dict:
    """Every loader on model ``name``, ``rounds`` times in turn; the median run per loader.

    Each run makes its loader and closes it after: idle workers of another loader would
    otherwise keep decoding the batches they prefetch, on the cores of the run measured.
    """
    net = make_model(name, device)
    runs: dict = {label: [] for label in makers}
    for _ in range(rounds):
        for label, make in makers.items():
            loader = make()
            batches = forever(loader)
            try:
                runs[label].append(run_steps(batches, net, device, warmup, steps))
            finally:
                batches.close()
                if hasattr(loader, "close"):
                    loader.close()
                del loader, batches
                gc.collect()  # DataLoader workers end when their iterator is freed
    return {label: {**median_run(r), "rounds": r} for label, r in runs.items()}


def median_run(runs: list[dict]) -> dict:
    mid = statistics.median(r["images_per_s"] for r in runs)
    return min(runs, key=lambda r: abs(r["images_per_s"] - mid))


def print_model(name: str, results: dict, bs: int, workers: int, device_name: str) -> None:
    peers = [r["images_per_s"] for k, r in results.items() if not k.startswith("fastload")]
    best_peer = max(peers) if peers else None
    print(f"{name}, bf16 autocast, channels_last, batch {bs}, {workers} workers each, on {device_name}:")
    print(f"  {'loader':26s} {'images/s':>9s} {'GPU data wait':>13s} {'step ms':>8s} {'wait ms':>8s} "
          f"{'host wait':>9s} {'vs best peer':>12s}")
    for label, r in results.items():
        ratio = f"{r['images_per_s'] / best_peer:11.2f}x" if best_peer else f"{'-':>12s}"
        print(f"  {label:26s} {r['images_per_s']:9.0f} {r['wait_share']:13.1%} {r['step_ms']:8.1f} "
              f"{r['wait_ms']:8.2f} {r['host_wait_share']:9.1%} {ratio}")


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(images=10240)  # 40 batches of 256 per epoch: epoch starts do not dominate
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=100, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=32,
                   help="untimed steps before each run: as many as the batches all workers make at once, so "
                        "the timed steps see the steady state (default: 32)")
    p.add_argument("--rounds", type=int, default=2, help="runs per loader, interleaved with the others")
    p.add_argument("--workers", type=int, default=min(16, available_cpus()))
    p.add_argument("--models", default="resnet50,resnet18", help="torchvision model names, comma-separated")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print("bench_gpu_train needs a CUDA GPU (run benchmarks/gpu_suite.sh on one); --quick checks the CPU path")
        return
    device = torch.device("cuda" if cuda else "cpu")
    if args.quick:
        bs, warmup, steps, rounds, workers = 8, 1, 3, 1, 2
        models = ["tiny"] if not cuda else ["resnet18"]
    else:
        bs, warmup, steps, rounds, workers = args.batch_size, max(1, args.warmup), args.steps, args.rounds, args.workers
        models = [m.strip() for m in args.models.split(",") if m.strip()]
    torch.backends.cudnn.benchmark = True
    root = photo_folder(args)
    makers = loaders(root, bs, workers, device)
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu (quick check only)"
    for name in models:
        results = bench_model(name, makers, device, warmup, steps, rounds)
        print_model(name, results, bs, workers, device_name)
        # One record per model, written as it ends: a run stopped later keeps it.
        report("bench_gpu_train", args, {"results": {name: results}, "batch_size": bs, "workers": workers,
                                         "steps": steps, "warmup": warmup, "rounds": rounds, "device": machine(),
                                         "dataset": photo_set_record(root)})
    print(f"(step = GPU time between the ends of consecutive steps; GPU data wait = from the end of the previous "
          f"step to the batch being ready on the training stream; median of {rounds} run(s) of {steps} steps "
          f"after {warmup} warm-up steps; host wait = time blocked in next())")


if __name__ == "__main__":
    main()
