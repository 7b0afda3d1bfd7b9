"""ImageNet training on fastload: one process or DDP under torchrun, checkpoints and --resume.

Written the way PyTorch's ``examples/imagenet/main.py`` is used (the same options and
habits: ``DistributedSampler`` or None, ``set_epoch`` on the sampler, ``validate()``
counting ``len(val_loader.sampler)``, a second loader for the validation samples the
sampler leaves out, a checkpoint every epoch, ``--resume``), with fastload's dataset and
loader constructors; docs/migration/dataloader.md shows the change line by line.

    torchrun --nproc_per_node=8 examples/imagenet/main.py /data/imagenet -a resnet50 -b 256 -j 8
    torchrun --nproc_per_node=8 examples/imagenet/main.py /data/imagenet --resume checkpoint.pth.tar

DATA holds ``train/<class>/*.jpg`` and ``val/<class>/*.jpg``. ``-a`` takes torchvision's
model names (torchvision installed) or ``tiny`` (a few layers: what the tests run on CPU).
"""

import argparse
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import Subset
from torch.utils.data.distributed import DistributedSampler

import fastload as fl

parser = argparse.ArgumentParser(description="ImageNet training on fastload")
parser.add_argument("data", help="folder holding train/ and val/")
parser.add_argument("-a", "--arch", default="resnet18", help="torchvision model name, or 'tiny'")
parser.add_argument("-j", "--workers", default=4, type=int, help="loader workers per rank")
parser.add_argument("--epochs", default=90, type=int)
parser.add_argument("--start-epoch", default=0, type=int)
parser.add_argument("-b", "--batch-size", default=256, type=int, help="per rank")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("--image-size", default=224, type=int)
parser.add_argument("--resume", default="", help="path of a checkpoint to resume from")
parser.add_argument("--checkpoint-dir", default=".")
parser.add_argument("-e", "--evaluate", action="store_true", help="evaluate on the validation set only")
parser.add_argument("--seed", default=None, type=int)
parser.add_argument("--print-freq", default=10, type=int)


def build_model(arch: str, num_classes: int) -> nn.Module:
    if arch == "tiny":
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes)
        )
    import torchvision  # only for the real architectures

    return torchvision.models.get_model(arch, num_classes=num_classes)


def main() -> None:
    args = parser.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        local_rank = int(os.environ["LOCAL_RANK"])
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
    rank = dist.get_rank() if distributed else 0
    if args.seed is not None:
        torch.manual_seed(args.seed)  # sets the Loader's order and augmentation too
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    # fastload: the datasets read encoded bytes; the transforms run on uint8 images and the
    # Loader normalizes on the device (no ToTensor/Normalize).
    train_dataset = fl.ImageFolder(os.path.join(args.data, "train"), transform=fl.transforms.train(args.image_size))
    val_dataset = fl.ImageFolder(os.path.join(args.data, "val"), transform=fl.transforms.eval(args.image_size))
    if distributed:
        train_sampler = DistributedSampler(train_dataset)
        val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = val_sampler = None
    train_loader = fl.DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=(train_sampler is None),
        num_workers=args.workers,
        pin_memory=True,
        sampler=train_sampler,
    )
    val_loader = fl.DataLoader(
        val_dataset,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.workers,
        pin_memory=True,
        sampler=val_sampler,
    )

    net = build_model(args.arch, len(train_dataset.classes)).to(device, memory_format=torch.channels_last)
    model = net  # checkpoints hold net's weights: they resume with or without DDP, on any world size
    if distributed:
        model = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    best_acc1 = 0.0
    if args.resume:
        checkpoint = torch.load(args.resume, map_location=device, weights_only=True)
        args.start_epoch = checkpoint["epoch"]
        best_acc1 = checkpoint["best_acc1"]
        net.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        print(f"=> rank {rank}: resumed from {args.resume} (epoch {checkpoint['epoch']})")

    if args.evaluate:
        validate(val_loader, val_dataset, model, criterion, device, args, distributed)
        return

    for epoch in range(args.start_epoch, args.epochs):
        if distributed:
            train_sampler.set_epoch(epoch)  # the Loader follows: new order and crops each epoch
        train(train_loader, model, criterion, optimizer, epoch, device, args)
        acc1 = validate(val_loader, val_dataset, model, criterion, device, args, distributed)
        scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if rank == 0:
            save_checkpoint(
                {
                    "epoch": epoch + 1,
                    "arch": args.arch,
                    "state_dict": net.state_dict(),
                    "best_acc1": best_acc1,
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                },
                is_best,
                args.checkpoint_dir,
            )
    train_loader.close()
    val_loader.close()
    if distributed:
        dist.destroy_process_group()


def train(loader, model, criterion, optimizer, epoch, device, args) -> None:
    model.train()
    end = time.perf_counter()
    for i, (images, target) in enumerate(loader):  # already on the device, normalized, channels_last
        data_time = time.perf_counter() - end
        target = target.to(device, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % args.print_freq == 0:
            print(
                f"Epoch [{epoch}][{i}/{len(loader)}] loss {loss.item():.4f} data {data_time:.3f}s "
                f"batch {time.perf_counter() - end:.3f}s"
            )
        end = time.perf_counter()


def validate(val_loader, val_dataset, model, criterion, device, args, distributed) -> float:
    model.eval()
    totals = torch.zeros(3, device=device)  # loss sum, correct, samples

    def run(loader):
        with torch.no_grad():
            for images, target in loader:
                target = target.to(device, non_blocking=True)
                output = model(images)
                totals[0] += criterion(output, target) * target.numel()
                totals[1] += (output.argmax(1) == target).sum()
                totals[2] += target.numel()

    run(val_loader)
    if distributed:
        dist.all_reduce(totals)
        covered = len(val_loader.sampler) * dist.get_world_size()
        if covered < len(val_dataset):
            # The samples the DistributedSampler (drop_last=True) left out, read by every rank
            # after the all_reduce, so each rank adds the same counts. No sampler: "this process
            # reads all of them", as in DataLoader.
            aux_val_dataset = Subset(val_dataset, range(covered, len(val_dataset)))
            with fl.DataLoader(
                aux_val_dataset,
                batch_size=args.batch_size,
                shuffle=False,
                num_workers=args.workers,
                pin_memory=True,
            ) as aux_val_loader:
                run(aux_val_loader)
    acc1 = 100.0 * (totals[1] / totals[2]).item()
    print(f" * Acc@1 {acc1:.3f} Loss {(totals[0] / totals[2]).item():.4f} ({int(totals[2].item())} images)")
    return acc1


def save_checkpoint(state: dict, is_best: bool, folder: str) -> None:
    path = os.path.join(folder, "checkpoint.pth.tar")
    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, os.path.join(folder, "model_best.pth.tar"))


if __name__ == "__main__":
    main()
