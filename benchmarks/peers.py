"""The pipelines fastload is compared with, written as their users write them.

Without torchvision (no CPU build here), its transforms are reimplemented with Pillow
exactly as torchvision's PIL path runs them: crop then bilinear resize, ToTensor,
Normalize, default_collate.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from PIL import Image

from fastload.config import IMAGENET_MEAN, IMAGENET_STD

MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


def rrc_box(w: int, h: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params, on Python's random."""
    area = w * h
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = random.randint(0, h - ch), random.randint(0, w - cw)
            return left, top, left + cw, top + ch
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        cw, ch = w, h
    top, left = (h - ch) // 2, (w - cw) // 2
    return left, top, left + cw, top + ch


def pil_train(path: str, size: int = 224) -> Image.Image:
    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")
    img = img.crop(rrc_box(*img.size)).resize((size, size), Image.Resampling.BILINEAR)
    if random.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return img


def pil_eval(path: str, size: int = 224, resize: int = 256) -> Image.Image:
    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")
    w, h = img.size
    nw, nh = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    img = img.resize((nw, nh), Image.Resampling.BILINEAR)
    top, left = int(round((nh - size) / 2)), int(round((nw - size) / 2))
    return img.crop((left, top, left + size, top + size))


class ClassicDataset(torch.utils.data.Dataset):
    """torchvision style: PIL transforms, ToTensor and Normalize per sample, float CHW out."""

    def __init__(self, paths: list[str], labels: list[int], train: bool) -> None:
        self.paths, self.labels, self.train = paths, labels, train

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        img = pil_train(self.paths[i]) if self.train else pil_eval(self.paths[i])
        x = torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1).float().div(255)  # ToTensor
        return (x - MEAN) / STD, self.labels[i]  # Normalize


class TimmDataset(ClassicDataset):
    """timm / apex style: PIL transforms, uint8 out, fast_collate, normalize after collate."""

    def __getitem__(self, i: int):
        img = pil_train(self.paths[i]) if self.train else pil_eval(self.paths[i])
        return np.asarray(img), self.labels[i]


def timm_fast_collate(batch):
    """timm.data.loader.fast_collate for numpy HWC uint8 samples."""
    targets = torch.tensor([b[1] for b in batch], dtype=torch.int64)
    h, w = batch[0][0].shape[:2]
    out = torch.zeros((len(batch), 3, h, w), dtype=torch.uint8)
    for i, (img, _) in enumerate(batch):
        out[i] += torch.from_numpy(np.rollaxis(img, 2).copy())
    return out, targets


def timm_normalize(x: torch.Tensor) -> torch.Tensor:
    """What timm's PrefetchLoader does after the copy (here on the CPU)."""
    return x.float().sub_(MEAN * 255).div_(STD * 255)
