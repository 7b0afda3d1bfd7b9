"""The dataset ``fastload tune`` measures: opened as the command line names it, refused where it is a
stream, and how small it may be for the batch sizes tried."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..datasets.open import detect, open_dataset


def check_root(args: argparse.Namespace) -> None:
    """``--root`` is given only with a list file, and is a folder."""
    if args.root is None:
        return
    kind = detect(args.dataset)
    if kind != "list":
        raise ValueError(f"--root applies to list files; {args.dataset} is a {kind}")
    if not os.path.isdir(args.root):
        raise FileNotFoundError(f"--root {args.root!r} is not a folder")


def open_tuned(args: argparse.Namespace, transform: Any = None) -> Any:
    """The dataset ``args`` name, list-file paths taken relative to ``--root`` when given."""
    check_root(args)
    if args.root is None:
        return open_dataset(args.dataset, transform=transform)
    return open_dataset(args.dataset, transform=transform, root=args.root)


def stream_refusal(name: str, dataset: Any) -> str:
    """Why the tuner cannot measure ``dataset`` (a stream), and what to do, for its kind."""
    kind = type(dataset).__name__
    if kind == "WebDataset":
        return (
            f"{name} is a WebDataset (tar shards), which fastload reads as a stream; the tuner needs random "
            "access by index; nothing in it is compressed: tune on the images it was made from (a folder, "
            "list file, LMDB or TFRecord files), or on an LMDB made from them with tools/folder2lmdb.py"
        )
    return (
        f"{name} is read as a stream ({kind}: GZIP-compressed TFRecord files); the tuner needs random access "
        "by index: uncompress the files first (gunzip), or tune on the images they were made from"
    )


def short_batches(samples: int, batch_sizes: list[int]) -> list[int]:
    """The batch sizes at which ``samples`` make fewer than 2 full batches an epoch: their runs time
    epoch starts and one short batch, not steady loading, and every size above ``samples`` measures
    the same one batch of all of them."""
    return [b for b in batch_sizes if samples < 2 * b]


def small_dataset_warning(name: str, samples: int, short: list[int]) -> str:
    """What measuring ``short`` batch sizes on ``samples`` samples means, in words."""
    sizes = ", ".join(map(str, short))
    return (
        f"{name} holds {samples} samples: fewer than 2 batches of size {sizes}, so those runs time epoch starts "
        f"and one short batch, not steady loading (tune on the full dataset, or give --batch-sizes of at most "
        f"{max(1, samples // 2)})"
    )
