"""The data path of timm's ``train.py`` on fastload, with timm's argument names and meaning.

A runnable port of what timm's train.py does from ``create_dataset`` to the loss (see
docs/migration/timm.md for the edit-by-edit diff against timm's script). The model and
optimizer are a stand-in (a tiny CNN and SGD) so it runs anywhere, on the CPU included;
everything about the data is timm's recipe::

    torchrun --nproc_per_node 2 examples/timm_train.py /data/imagenet --img-size 224 -b 128 -j 8 \\
        --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --remode pixel --mixup 0.8 --cutmix 1.0 \\
        --smoothing 0.1 --color-jitter 0.4

``data_dir`` holds ``train/`` and ``validation/`` (timm's default split names, or one of
their synonyms as timm looks for them: ``val/``, ``valid/``, ``eval/``, ...), one folder per
class. ``--record PATH`` writes what each rank saw per epoch (a JSON file per rank): the test
suite uses it to check coverage and soft targets.
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

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="timm train.py's data path on fastload")
    p.add_argument("data", nargs="?", metavar="DIR")
    p.add_argument("--data-dir", metavar="DIR")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="validation")
    p.add_argument("--num-classes", type=int, default=None)
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--input-size", default=None, nargs=3, type=int)
    p.add_argument("--crop-pct", default=None, type=float)
    p.add_argument("--mean", type=float, nargs="+", default=None)
    p.add_argument("--std", type=float, nargs="+", default=None)
    p.add_argument("--interpolation", default="", type=str)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("-vb", "--validation-batch-size", type=int, default=None)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=2e-5)
    p.add_argument("--epochs", type=int, default=300)
    # Augmentation & regularization: timm's names, defaults and meaning.
    p.add_argument("--no-aug", action="store_true")
    p.add_argument("--train-crop-mode", type=str, default=None)
    p.add_argument("--scale", type=float, nargs="+", default=[0.08, 1.0])
    p.add_argument("--ratio", type=float, nargs="+", default=[3.0 / 4.0, 4.0 / 3.0])
    p.add_argument("--hflip", type=float, default=0.5)
    p.add_argument("--vflip", type=float, default=0.0)
    p.add_argument("--color-jitter", type=float, default=0.4)
    p.add_argument("--color-jitter-prob", type=float, default=None)
    p.add_argument("--grayscale-prob", type=float, default=None)
    p.add_argument("--gaussian-blur-prob", type=float, default=None)
    p.add_argument("--aa", type=str, default=None)
    p.add_argument("--reprob", type=float, default=0.0)
    p.add_argument("--remode", type=str, default="pixel")
    p.add_argument("--recount", type=int, default=1)
    p.add_argument("--resplit", action="store_true")
    p.add_argument("--mixup", type=float, default=0.0)
    p.add_argument("--cutmix", type=float, default=0.0)
    p.add_argument("--cutmix-minmax", type=float, nargs="+", default=None)
    p.add_argument("--mixup-prob", type=float, default=1.0)
    p.add_argument("--mixup-switch-prob", type=float, default=0.5)
    p.add_argument("--mixup-mode", type=str, default="batch")
    p.add_argument("--mixup-off-epoch", default=0, type=int)
    p.add_argument("--smoothing", type=float, default=0.1)
    p.add_argument("--train-interpolation", type=str, default="random")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("-j", "--workers", type=int, default=4)
    p.add_argument("--pin-mem", action="store_true")
    p.add_argument(
        "--no-prefetcher",
        action="store_true",
        help="erase each image before mixing, as timm's loader without its prefetcher (the device stage stays on)",
    )
    # This example's own: a short run and what it saw.
    p.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    p.add_argument("--record", default=None, help="write what each rank saw to PATH.<rank>.json")
    args = p.parse_args(argv)
    args.data_dir = args.data_dir or args.data
    if not args.data_dir:
        p.error("give the dataset folder (DIR or --data-dir)")
    return args


SPLIT_SYNONYMS = (("train", "training"), ("val", "valid", "validation", "eval", "evaluation"))


def split_folder(root: str, split: str) -> str:
    """<root>/<split>, else the folder of one of its synonyms, as timm's create_dataset looks
    (the default ``--val-split validation`` reads ``val/``)."""
    name = split.split("[")[0]
    tried = dict.fromkeys([name, *next((s for s in SPLIT_SYNONYMS if name in s), ())])
    for folder in tried:
        if os.path.isdir(os.path.join(root, folder)):
            return os.path.join(root, folder)
    raise FileNotFoundError(
        f"no folder for split {split!r} in {root} (tried {', '.join(tried)}); --val-split '' trains without evaluation"
    )


def resolve_data_config(args: argparse.Namespace) -> dict:
    """timm's resolve_data_config for a model without a pretrained config: the arguments, else ImageNet's."""
    size = args.input_size[1:] if args.input_size else (args.img_size or 224,) * 2
    return {
        "input_size": (3, *size),
        "interpolation": args.interpolation or "bilinear",
        "mean": tuple(args.mean or IMAGENET_MEAN),
        "std": tuple(args.std or IMAGENET_STD),
        "crop_pct": args.crop_pct or 0.875,
    }


class TinyNet(torch.nn.Module):
    """The stand-in for timm.create_model(args.model)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=4)
        self.fc = torch.nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 1).flatten(1))


def build_batch_transforms(args: argparse.Namespace, device: torch.device) -> tuple[list, fl.augment.Mixup | None]:
    """timm's Mixup/CutMix and RandomErasing as the Loader's batch transforms, in timm's order.

    With its prefetcher (the default) timm mixes the batch in the workers' collate
    (FastCollateMixup) and erases after normalizing it (PrefetchLoader): erased boxes are
    pure noise over the mixed images. With ``--no-prefetcher`` each image is erased in the
    workers and the batch mixed in the loop: boxes are mixed with the partner image.
    """
    erasing = None
    if args.reprob > 0 and not args.no_aug:
        erasing = fl.augment.RandomErasing(
            args.reprob, mode=args.remode, max_count=args.recount, num_splits=0, device=device
        )
    mixup_fn = None
    if args.mixup > 0 or args.cutmix > 0.0 or args.cutmix_minmax is not None:
        mixup_fn = fl.augment.Mixup(
            mixup_alpha=args.mixup,
            cutmix_alpha=args.cutmix,
            cutmix_minmax=args.cutmix_minmax,
            prob=args.mixup_prob,
            switch_prob=args.mixup_switch_prob,
            mode=args.mixup_mode,
            label_smoothing=args.smoothing,
            num_classes=args.num_classes,
        )
    steps = [erasing, mixup_fn] if args.no_prefetcher else [mixup_fn, erasing]
    return [t for t in steps if t is not None], mixup_fn


def build_loaders(args: argparse.Namespace, data_config: dict, device: torch.device):
    """timm's create_dataset + create_loader (+ Mixup) calls, as fastload ones."""
    img_size = data_config["input_size"][1:]
    train_interpolation = args.train_interpolation
    if args.no_aug or not train_interpolation:
        train_interpolation = data_config["interpolation"]
    if args.no_aug:  # timm's transforms_noaug_train: Resize + CenterCrop
        train_tf = fl.transforms.eval(img_size, resize=min(img_size))
    else:
        train_tf = fl.transforms.train(
            img_size,
            scale=args.scale,
            ratio=args.ratio,
            hflip=args.hflip,
            vflip=args.vflip,
            color_jitter=args.color_jitter,
            color_jitter_prob=args.color_jitter_prob,
            grayscale_prob=args.grayscale_prob or 0.0,
            gaussian_blur_prob=args.gaussian_blur_prob or 0.0,
            auto_augment=args.aa,
            interpolation=train_interpolation,
            mean=data_config["mean"],
            train_crop_mode=args.train_crop_mode,
        )
    dataset_train = fl.ImageFolder(split_folder(args.data_dir, args.train_split), transform=train_tf)
    args.num_classes = args.num_classes or len(dataset_train.classes)

    batch_transforms, mixup_fn = build_batch_transforms(args, device)

    common = dict(
        normalize=fl.Normalize(mean=data_config["mean"], std=data_config["std"]),
        device=device,
        num_workers=args.workers,
        return_index=args.record is not None,
    )
    # timm's training loader shuffles and drops the last incomplete batch; its seed is args.seed.
    loader_train = fl.Loader(
        dataset_train,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        seed=args.seed,
        batch_transform=batch_transforms,
        **common,
    )
    loader_eval = None
    if args.val_split:
        eval_tf = fl.transforms.eval(
            img_size, crop_pct=data_config["crop_pct"], interpolation=data_config["interpolation"]
        )
        loader_eval = fl.Loader(
            fl.ImageFolder(split_folder(args.data_dir, args.val_split), transform=eval_tf),
            batch_size=args.validation_batch_size or args.batch_size,
            **common,
        )
    return loader_train, loader_eval, mixup_fn


def main(argv=None) -> None:
    args = parse_args(argv)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        if args.device.startswith("cuda"):
            args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    data_config = resolve_data_config(args)
    loader_train, loader_eval, mixup_fn = build_loaders(args, data_config, device)

    model = TinyNet(args.num_classes).to(device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    # timm: SoftTargetCrossEntropy with Mixup (targets arrive smoothed), else label smoothing.
    train_loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.0 if mixup_fn else args.smoothing)
    rank = dist.get_rank() if distributed else 0
    record: dict = {}
    with loader_train:
        for epoch in range(args.epochs):
            loader_train.set_epoch(epoch)  # timm: _set_loader_epoch
            if args.mixup_off_epoch and epoch >= args.mixup_off_epoch and mixup_fn is not None:
                mixup_fn.mixup_enabled = False
            seen, steps, soft, mixed, losses = [], 0, 0, 0, []
            model.train()
            for batch in loader_train:
                input, target = batch[0], batch[1]
                # The Loader's batches are channels_last: in the model's memory format instead, or
                # DDP copies every conv weight's gradient into its buckets (and warns, on CUDA).
                input = input.contiguous(memory_format=memory_format)
                loss = train_loss_fn(model(input), target)
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
                if args.max_steps and steps >= args.max_steps:
                    break
            record[epoch] = {
                "seen": seen,
                "steps": steps,
                "soft_batches": soft,
                "mixed_batches": mixed,
                "losses": losses,
                "target_shape": list(target.shape),
                "input_channels_last": input.is_contiguous(memory_format=torch.channels_last),
                "model_channels_last": next(model.parameters()).is_contiguous(memory_format=torch.channels_last),
                "batches": len(loader_train),
            }
            if loader_eval is not None:
                model.eval()
                with torch.no_grad():
                    correct = total = 0
                    for batch in loader_eval:
                        output = model(batch[0].contiguous(memory_format=memory_format))
                        correct += int((output.argmax(1) == batch[1]).sum())
                        total += len(batch[1])
                record[epoch]["eval"] = {"correct": correct, "total": total}
            if rank == 0:
                print(f"epoch {epoch}: {steps} steps, loss {sum(losses) / max(1, len(losses)):.4f}", flush=True)
    if loader_eval is not None:
        loader_eval.close()
    if args.record:
        with open(f"{args.record}.{rank}.json", "w") as f:
            json.dump(record, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
