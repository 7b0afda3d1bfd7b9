"""A training step fed by fastload, by DataLoader + torchvision transforms + pin_memory,
and by timm's create_loader: images/s and the share of each step spent waiting for data.

ResNet-50 (torchvision), channels_last, bf16 autocast, SGD. Needs CUDA for a real run;
--quick runs a tiny model on the CPU through the same code (peers need torchvision/timm).
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
from common import machine, parser, photo_folder, report
from torch.utils.data import DataLoader

import fastload as fl
from fastload.config import IMAGENET_MEAN, IMAGENET_STD
from fastload.system import available_cpus


def model_for(device: torch.device, quick: bool) -> nn.Module:
    if quick:
        net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 10))
    else:
        from torchvision.models import resnet50

        net = resnet50()
    return net.to(device).to(memory_format=torch.channels_last)


def train(batches, net: nn.Module, device: torch.device, steps: int) -> dict:
    """Times ``steps`` steps after 3 warm-up steps; wait = time blocked getting a batch."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    it = iter(batches)
    wait = total = 0.0
    images = 0
    for i in range(steps + 3):
        start = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(batches)
            x, y = next(it)
        x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = (y.to(device, non_blocking=True) % 1000) if not isinstance(net, nn.Sequential) else y.to(device) % 10
        got = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        end = time.perf_counter()
        if i >= 3:
            wait += got - start
            total += end - start
            images += x.shape[0]
    return {"images_per_s": images / total, "wait_share": wait / total}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--workers", type=int, default=available_cpus())
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print("bench_gpu_train needs a CUDA GPU (run benchmarks/gpu_suite.sh on one); --quick checks the CPU path")
        return
    device = torch.device("cuda" if cuda else "cpu")
    bs, steps, workers = (8, 3, 2) if args.quick else (args.batch_size, args.steps, args.workers)
    root = photo_folder(args)
    net = model_for(device, args.quick)
    results = {}

    ds = fl.ImageFolder(root, transform=fl.transforms.train(224))
    with fl.Loader(ds, batch_size=bs, shuffle=True, drop_last=True, num_workers=workers, device=device) as loader:
        results["fastload"] = train(loader, net, device, steps)

    try:
        import torchvision.transforms as T
        from torchvision.datasets import ImageFolder as TVImageFolder
    except ImportError:
        print("torchvision not installed: DataLoader + torchvision peer skipped")
    else:
        tv = TVImageFolder(root, T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                                            T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]))
        dl = DataLoader(tv, batch_size=bs, shuffle=True, drop_last=True, num_workers=workers, pin_memory=cuda,
                        persistent_workers=True)
        results["torchvision DataLoader"] = train(dl, net, device, steps)

    try:
        from timm.data import ImageDataset, create_loader
    except ImportError:
        print("timm not installed: create_loader peer skipped")
    else:
        if cuda:
            tl = create_loader(ImageDataset(root), input_size=(3, 224, 224), batch_size=bs, is_training=True,
                               use_prefetcher=True, num_workers=workers, persistent_workers=True)
            results["timm create_loader"] = train(tl, net, device, steps)

    name = torch.cuda.get_device_name(0) if cuda else "cpu (quick check only)"
    print(f"{'ResNet-50' if not args.quick else 'tiny model'} bf16 channels_last, batch {bs}, {workers} workers, "
          f"{steps} steps on {name}:")
    base = results["fastload"]["images_per_s"]
    for k, r in results.items():
        print(f"  {k:24s} {r['images_per_s']:8.0f} images/s  data wait {r['wait_share']:6.1%}  "
              f"(fastload {base / r['images_per_s']:.2f}x)")
    report("bench_gpu_train", args, {"results": results, "batch_size": bs, "workers": workers, "device": machine()})


if __name__ == "__main__":
    main()
