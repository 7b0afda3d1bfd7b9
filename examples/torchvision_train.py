"""The data path of torchvision's ``references/classification/train.py`` on fastload.

A runnable port of the reference recipe's data loading (``load_data``, ``presets.py``'s
ClassificationPresetTrain/Eval, ``get_mixup_cutmix`` and the DataLoaders), with the
reference's argument names; see docs/migration/torchvision-references.md for the diff.
The model and optimizer are a stand-in (a tiny CNN and SGD) so it runs anywhere::

    torchrun --nproc_per_node 8 examples/torchvision_train.py --data-path /data/imagenet -b 128 -j 8 \\
        --auto-augment ta_wide --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 \\
        --label-smoothing 0.1 --train-crop-size 176 --val-resize-size 232

``--data-path`` holds ``train/`` and ``val/``. ``--record PATH`` writes what each rank saw
per epoch (a JSON file per rank), for the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import fastload as fl

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="torchvision's classification reference on fastload")
    p.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/", type=str)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", type=str)
    p.add_argument("-b", "--batch-size", default=32, type=int)
    p.add_argument("--epochs", default=90, type=int)
    p.add_argument("-j", "--workers", default=16, type=int)
    p.add_argument("--lr", default=0.1, type=float)
    p.add_argument("--momentum", default=0.9, type=float)
    p.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    p.add_argument("--label-smoothing", default=0.0, type=float)
    p.add_argument("--mixup-alpha", default=0.0, type=float)
    p.add_argument("--cutmix-alpha", default=0.0, type=float)
    p.add_argument("--auto-augment", default=None, type=str)
    p.add_argument("--ra-magnitude", default=9, type=int)
    p.add_argument("--augmix-severity", default=3, type=int)
    p.add_argument("--random-erase", default=0.0, type=float)
    p.add_argument("--interpolation", default="bilinear", type=str)
    p.add_argument("--val-resize-size", default=256, type=int)
    p.add_argument("--val-crop-size", default=224, type=int)
    p.add_argument("--train-crop-size", default=224, type=int)
    p.add_argument("--backend", default="PIL", type=str.lower, help="pil or tensor: no effect (decoded to arrays)")
    p.add_argument("--use-v2", action="store_true", help="no effect: MixUp/CutMix draw as v1's and v2's both do")
    p.add_argument("--cache-dataset", action="store_true", help="refused: a fastload ImageFolder is a directory scan")
    p.add_argument("--seed", default=0, type=int, help="fastload's: the seed of every draw (pass the same to resume)")
    # This example's own.
    p.add_argument("--record", default=None, help="write what each rank saw to PATH.<rank>.json")
    return p


def auto_augment(policy: str, interpolation: str, args: argparse.Namespace):
    """presets.ClassificationPresetTrain's auto-augment choice."""
    if policy == "ra":
        return fl.transforms.RandAugment(interpolation=interpolation, magnitude=args.ra_magnitude)
    if policy == "ta_wide":
        return fl.transforms.TrivialAugmentWide(interpolation=interpolation)
    if policy == "augmix":
        return fl.transforms.AugMix(interpolation=interpolation, severity=args.augmix_severity)
    return fl.transforms.AutoAugment(policy=fl.transforms.AutoAugmentPolicy(policy), interpolation=interpolation)


def load_data(traindir: str, valdir: str, args: argparse.Namespace):
    """The reference's load_data: ImageFolders with the presets as fastload transforms."""
    if args.backend not in ("pil", "tensor"):  # the reference's presets refuse it too
        raise ValueError(f"backend can be 'tensor' or 'pil', but got {args.backend}")
    if args.cache_dataset:
        # The reference pickles its datasets (transforms included) to ~/.torch/vision/datasets/imagefolder:
        # a fastload ImageFolder is a directory scan, and a cache the original left holds torchvision's.
        raise ValueError("--cache-dataset: not needed with fastload (an ImageFolder is a directory scan); drop it")
    if args.interpolation != "bilinear":
        raise ValueError(
            "fastload's RandomResizedCrop and eval resize are antialiased bilinear; "
            f"--interpolation {args.interpolation} is not supported"
        )
    train_tf = [fl.transforms.RandomResizedCrop(args.train_crop_size), fl.transforms.RandomHorizontalFlip(0.5)]
    if args.auto_augment is not None:
        train_tf.append(auto_augment(args.auto_augment, args.interpolation, args))
    dataset = fl.ImageFolder(traindir, transform=fl.transforms.Compose(train_tf))
    eval_tf = fl.transforms.Compose(
        [fl.transforms.Resize(args.val_resize_size), fl.transforms.CenterCrop(args.val_crop_size)]
    )
    dataset_test = fl.ImageFolder(valdir, transform=eval_tf)
    return dataset, dataset_test


def batch_transforms(args: argparse.Namespace, num_classes: int) -> list:
    """What the reference does after Normalize: RandomErasing per sample, MixUp/CutMix in
    its collate_fn; here on the normalized batch."""
    steps = []
    if args.random_erase > 0:
        # torchvision's RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0) in timm's terms.
        steps.append(
            fl.augment.RandomErasing(
                args.random_erase, min_area=0.02, max_area=0.33, min_aspect=0.3, max_aspect=3.3, mode="const"
            )
        )
    mixes = []
    if args.mixup_alpha > 0:
        mixes.append(fl.augment.MixUp(alpha=args.mixup_alpha, num_classes=num_classes))
    if args.cutmix_alpha > 0:
        mixes.append(fl.augment.CutMix(alpha=args.cutmix_alpha, num_classes=num_classes))
    if mixes:
        steps.append(fl.augment.RandomChoice(mixes))
    return steps


class TinyNet(torch.nn.Module):
    """The stand-in for torchvision.models.get_model(args.model)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=4)
        self.fc = torch.nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 1).flatten(1))


def main(args: argparse.Namespace) -> None:
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:  # utils.init_distributed_mode
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        if args.device.startswith("cuda"):
            args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    device = torch.device(args.device)
    dataset, dataset_test = load_data(os.path.join(args.data_path, "train"), os.path.join(args.data_path, "val"), args)
    num_classes = len(dataset.classes)
    # DistributedSampler / RandomSampler, pin_memory, collate_fn: the Loader's own.
    common = dict(
        batch_size=args.batch_size,
        num_workers=args.workers,
        device=device,
        normalize=fl.Normalize(mean=MEAN, std=STD),
        return_index=args.record is not None,
    )
    data_loader = fl.Loader(
        dataset, shuffle=True, seed=args.seed, batch_transform=batch_transforms(args, num_classes), **common
    )
    data_loader_test = fl.Loader(dataset_test, shuffle=False, **common)

    model = TinyNet(num_classes).to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    rank = dist.get_rank() if distributed else 0
    record: dict = {}
    with data_loader, data_loader_test:
        for epoch in range(args.epochs):
            data_loader.set_epoch(epoch)  # train_sampler.set_epoch(epoch)
            model.train()
            seen, steps, soft, mixed, losses = [], 0, 0, 0, []
            for batch in data_loader:
                image, target = batch[0], batch[1]  # already on device: no .to(device)
                # The Loader's batches are channels_last: in the model's memory format (contiguous)
                # instead, or DDP copies every conv weight's gradient into its buckets (and warns, on CUDA).
                image = image.contiguous()
                loss = criterion(model(image), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
                losses.append(loss.item())
                if args.record:
                    seen += batch[2].tolist()
                    # Soft: probability rows (mixed and/or smoothed); mixed: some row between two classes.
                    soft += int(
                        target.dim() == 2
                        and target.is_floating_point()
                        and bool(torch.allclose(target.sum(1), torch.ones(len(target)), atol=1e-4))
                    )
                    mixed += int(target.dim() == 2 and bool(((target > 0) & (target < 1)).any()))
            record[epoch] = {
                "seen": seen,
                "steps": steps,
                "soft_batches": soft,
                "mixed_batches": mixed,
                "losses": losses,
                "target_shape": list(target.shape),
                "input_channels_last": image.is_contiguous(memory_format=torch.channels_last),
                "model_channels_last": next(model.parameters()).is_contiguous(memory_format=torch.channels_last),
                "batches": len(data_loader),
            }
            model.eval()
            correct = total = 0
            with torch.inference_mode():
                for batch in data_loader_test:
                    correct += int((model(batch[0].contiguous()).argmax(1) == batch[1]).sum())
                    total += len(batch[1])
            record[epoch]["eval"] = {"correct": correct, "total": total}
            if rank == 0:
                print(
                    f"epoch {epoch}: {steps} steps, loss {sum(losses) / max(1, len(losses)):.4f}, "
                    f"acc {correct / max(1, total):.3f}",
                    flush=True,
                )
    if args.record:
        with open(f"{args.record}.{rank}.json", "w") as f:
            json.dump(record, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(get_args_parser().parse_args())
