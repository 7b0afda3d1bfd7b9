"""A training script written like PyTorch's examples/imagenet/main.py, moved to fastload.

The move changed only the dataset and loader constructors (the lines marked ``# fastload``,
with what they were before); everything else is main.py's habits: ``torch.manual_seed``,
``DistributedSampler`` or None, ``shuffle=(train_sampler is None)``, ``set_epoch`` on the
sampler, ``len(val_loader.sampler)`` in ``validate()`` and a second loader built inside every
``validate()`` for the samples the sampler left out, a checkpoint every epoch and
``--resume``. On CPU, with a tiny model. Run by test_dataloader_swap.py, under torchrun
(2 ranks, gloo) or in one process; it records what each rank saw to ``--record``.<rank>.json.

``--rerun-from EPOCH`` (for the tests): after training, start again as a new run would,
resuming from the checkpoint saved after epoch EPOCH - 1.
"""

import argparse
import json
import os
import random

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import Subset
from torch.utils.data.distributed import DistributedSampler

import fastload as fl

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--start-epoch", type=int, default=0)
parser.add_argument("-b", "--batch-size", type=int, default=4)
parser.add_argument("-j", "--workers", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--resume", default="")
parser.add_argument("--checkpoint-dir", default=".")
parser.add_argument("--record", default="seen")
parser.add_argument("--rerun-from", type=int, default=None)


def main(argv=None):
    args = parser.parse_args(argv)
    args.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    args.rank, args.world_size = 0, 1
    if args.distributed:
        dist.init_process_group("gloo")
        args.rank, args.world_size = dist.get_rank(), dist.get_world_size()
    record = {"runs": []}
    main_worker(args, record)
    if args.rerun_from is not None:
        if args.distributed:
            dist.barrier()  # rank 0 wrote the checkpoint
        args.resume = os.path.join(args.checkpoint_dir, f"checkpoint.{args.rerun_from}.pth.tar")
        main_worker(args, record)
    with open(f"{args.record}.{args.rank}.json", "w") as f:
        json.dump(record, f)
    if args.distributed:
        dist.destroy_process_group()
    return record


def main_worker(args, record):
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
    seen = {"train": {}, "crops": {}, "val": {}, "aux": {}}
    record["runs"].append(seen)
    classes = len(os.listdir(os.path.join(args.data, "train")))
    model = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, classes))
    if args.distributed:
        model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = SGD(model.parameters(), args.lr)
    start_epoch = args.start_epoch
    if args.resume:
        checkpoint = torch.load(args.resume, weights_only=True)
        start_epoch = checkpoint["epoch"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])

    # Data loading code
    traindir = os.path.join(args.data, "train")
    valdir = os.path.join(args.data, "val")
    # fastload: was datasets.ImageFolder(traindir, transforms.Compose([RandomResizedCrop(16), ..., normalize]))
    train_dataset = fl.ImageFolder(traindir, transform=fl.transforms.train(16))
    # fastload: was datasets.ImageFolder(valdir, transforms.Compose([Resize(18), CenterCrop(16), ..., normalize]))
    val_dataset = fl.ImageFolder(valdir, transform=fl.transforms.eval(16, resize=18))

    if args.distributed:
        train_sampler = DistributedSampler(train_dataset)
        val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = None
        val_sampler = None

    # fastload: was torch.utils.data.DataLoader(...), same arguments
    train_loader = fl.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)

    # fastload: was torch.utils.data.DataLoader(...), same arguments
    val_loader = fl.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler)
    seen["val_sampler_len"] = len(val_loader.sampler)
    seen["train_batches"] = len(train_loader)

    for epoch in range(start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, seen)
        validate(val_loader, model, criterion, args, epoch, seen)
        if args.rank == 0:
            torch.save({"epoch": epoch + 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},
                       os.path.join(args.checkpoint_dir, f"checkpoint.{epoch + 1}.pth.tar"))


class SGD:
    """torch.optim.SGD's plain step: the first torch.optim optimizer imports torch._dynamo,
    seconds of a test's time on a busy CPU, and the optimizer is not what this script tests."""

    def __init__(self, params, lr):
        self.params, self.lr = list(params), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p -= self.lr * p.grad

    def state_dict(self):
        return {"lr": self.lr}

    def load_state_dict(self, state):
        self.lr = state["lr"]


def train(train_loader, model, criterion, optimizer, epoch, seen):
    model.train()
    labels, crops = [], []
    for i, (images, target) in enumerate(train_loader):
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        labels += target.tolist()
        crops.append(round(float(images.double().sum()), 3))
    seen["train"][epoch], seen["crops"][epoch] = labels, crops


def validate(val_loader, model, criterion, args, epoch, seen):
    def run_validate(loader, into):
        with torch.no_grad():
            for i, (images, target) in enumerate(loader):
                output = model(images)
                criterion(output, target)
                correct[0] += (output.argmax(1) == target).sum().item()
                correct[1] += target.numel()
                into += target.tolist()

    model.eval()
    correct = [0, 0]
    seen["val"][epoch], seen["aux"][epoch] = [], []
    run_validate(val_loader, seen["val"][epoch])
    if args.distributed:
        total = torch.tensor(correct, dtype=torch.float64)
        dist.all_reduce(total)
        correct = total.tolist()
    if args.distributed and (len(val_loader.sampler) * args.world_size < len(val_loader.dataset)):
        aux_val_dataset = Subset(val_loader.dataset,
                                 range(len(val_loader.sampler) * args.world_size, len(val_loader.dataset)))
        # fastload: was torch.utils.data.DataLoader(aux_val_dataset, ...), same arguments: without a
        # sampler every rank reads all of it, as DataLoader does
        aux_val_loader = fl.DataLoader(
            aux_val_dataset, batch_size=args.batch_size, shuffle=False,
            num_workers=args.workers, pin_memory=True)
        run_validate(aux_val_loader, seen["aux"][epoch])
    return correct[0] / max(1, correct[1])


if __name__ == "__main__":
    main()
