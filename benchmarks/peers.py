"""The pipelines fastload is compared with, written as their users write them.

torchvision and timm's data pipeline do not import on this CPU machine (no torchvision
build beside the local torch), so both are replicated here step by step from their
sources, with the same Pillow calls in the same order:

* classic (torchvision ImageFolder + transforms): ``pil_loader`` → RandomResizedCrop
  (``get_params`` on torch's RNG, ``F.resized_crop`` = PIL crop, then PIL bilinear
  resize, which is antialiased) → RandomHorizontalFlip → ToTensor → Normalize →
  ``default_collate`` (float32 N×C×H×W, normalized, in the DataLoader workers).
  Eval: Resize(256) (PIL bilinear) → CenterCrop(224) → ToTensor → Normalize.
* timm (``create_loader(..., use_prefetcher=True)`` on the CPU side): ``Image.open(f)
  .convert("RGB")`` → RandomResizedCropAndInterpolation (``get_params`` on Python's
  ``random``, bilinear) → RandomHorizontalFlip → MaybePILToTensor (uint8 C×H×W view) →
  timm's ``fast_collate`` (uint8 N×C×H×W); normalization happens on the GPU after the copy.
* NVIDIA DALI's CPU-only pipeline, when ``nvidia-dali-cuda120`` is installed (``make bench``):
  ROI random-crop decode, antialiased resize, flip, uint8 N×H×W×C.
* SPDL (``pip install spdl``; it loads the system's FFmpeg 4-8 shared libraries, e.g. Debian's
  libavutil57, libavcodec59, libavformat59, libavfilter8, libswscale6): FFmpeg decodes each
  JPEG and one filter graph crops the RandomResizedCrop box, scales it to 224 (bilinear,
  which swscale widens when shrinking) and flips it; SPDL's thread pipeline runs the loads
  and stacks batches, uint8 N×H×W×C.
* FFCV 1.0.2 is not here: ``pip install ffcv`` compiles against OpenCV's C++ headers and
  libturbojpeg found by pkg-config (``opencv4`` / ``libturbojpeg``), which a machine with
  only pip packages lacks (its setup.py stops: "Could not find required package: opencv4"),
  and it needs numba beside torch. With Debian's pkg-config, libturbojpeg0-dev and
  libopencv-dev installed, ``make bench-ffcv`` builds it into a venv of its own, and
  ``bench_handoff_peers.py`` runs its pipeline there as a subprocess (``ffcv_peer.py``:
  a ``.beton`` of the photos, ``RandomResizedCropRGBImageDecoder`` → flip → uint8 N×C×H×W).
"""

from __future__ import annotations

import contextlib
import math
import os
import random

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from fastload.config import IMAGENET_MEAN, IMAGENET_STD

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


# --- shared Pillow steps (torchvision.transforms.functional_pil) -----------------------------

def pil_loader(path: str) -> Image.Image:
    """torchvision.datasets.folder.pil_loader (timm's ImageDataset does the same)."""
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


def resized_crop(img: Image.Image, top: int, left: int, h: int, w: int, size: int) -> Image.Image:
    """F.resized_crop on a PIL image: crop, then bilinear resize (antialiased by Pillow)."""
    img = img.crop((left, top, left + w, top + h))
    return img.resize((size, size), Image.Resampling.BILINEAR)


def fallback_box(width: int, height: int) -> tuple[int, int, int, int]:
    in_ratio = width / height
    if in_ratio < min(RATIO):
        w, h = width, int(round(width / min(RATIO)))
    elif in_ratio > max(RATIO):
        h, w = height, int(round(height * max(RATIO)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def tv_rrc_params(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params: (top, left, h, w) on torch's RNG."""
    area = height * width
    log_ratio = torch.log(torch.tensor(RATIO))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(SCALE[0], SCALE[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = torch.randint(0, height - h + 1, size=(1,)).item()
            left = torch.randint(0, width - w + 1, size=(1,)).item()
            return top, left, h, w
    return fallback_box(width, height)


def timm_rrc_params(width: int, height: int) -> tuple[int, int, int, int]:
    """timm RandomResizedCropAndInterpolation.get_params: (top, left, h, w) on ``random``."""
    area = width * height
    for _ in range(10):
        target_area = random.uniform(*SCALE) * area
        log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
        aspect = math.exp(random.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if w <= width and h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    return fallback_box(width, height)


def hflip(img: Image.Image) -> Image.Image:
    """RandomHorizontalFlip(p=0.5) as torchvision draws it."""
    return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if torch.rand(1) < 0.5 else img


def resize_center_crop(img: Image.Image, size: int = 224, resize: int = 256) -> Image.Image:
    """Resize(resize) (shorter side, int() of the longer) then CenterCrop(size), on PIL."""
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(resize * long / short)
    nw, nh = (resize, new_long) if w <= h else (new_long, resize)
    img = img.resize((nw, nh), Image.Resampling.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


# --- classic torchvision style ---------------------------------------------------------------

MEAN, STD = list(IMAGENET_MEAN), list(IMAGENET_STD)


def to_tensor(img: Image.Image) -> torch.Tensor:
    """torchvision ToTensor for an RGB PIL image."""
    x = torch.from_numpy(np.array(img, np.uint8, copy=True))
    x = x.view(img.size[1], img.size[0], 3).permute((2, 0, 1)).contiguous()
    return x.to(dtype=torch.get_default_dtype()).div(255)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """torchvision Normalize (not in place: clones first)."""
    x = x.clone()
    mean = torch.as_tensor(MEAN, dtype=x.dtype).view(-1, 1, 1)
    std = torch.as_tensor(STD, dtype=x.dtype).view(-1, 1, 1)
    return x.sub_(mean).div_(std)


class ClassicDataset(torch.utils.data.Dataset):
    """torchvision ImageFolder + transforms: float32 normalized C×H×W per sample."""

    def __init__(self, paths: list[str], labels: list[int], train: bool, size: int = 224) -> None:
        self.paths, self.labels, self.train, self.size = paths, labels, train, size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        img = pil_loader(self.paths[i])
        if self.train:
            img = hflip(resized_crop(img, *tv_rrc_params(*img.size), self.size))
        else:
            img = resize_center_crop(img, self.size, int(self.size / 0.875))
        return normalize(to_tensor(img)), self.labels[i]


# --- timm style ----------------------------------------------------------------------------

def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """torchvision F.pil_to_tensor (timm's MaybePILToTensor): uint8 C×H×W, a permuted view."""
    x = torch.as_tensor(np.array(img, copy=True))
    return x.view(img.size[1], img.size[0], 3).permute((2, 0, 1))


class TimmDataset(ClassicDataset):
    """timm ImageDataset + transforms_imagenet_train/eval(use_prefetcher=True): uint8 C×H×W."""

    def __getitem__(self, i: int):
        with open(self.paths[i], "rb") as f:
            img = Image.open(f).convert("RGB")
        if self.train:
            img = hflip(resized_crop(img, *timm_rrc_params(*img.size), self.size))
        else:
            img = resize_center_crop(img, self.size, math.floor(self.size / 0.875))
        return pil_to_tensor(img), self.labels[i]


def timm_fast_collate(batch):
    """timm.data.loader.fast_collate, torch.Tensor branch (uint8 N×C×H×W)."""
    targets = default_collate([b[1] for b in batch])
    if targets.ndim == 1:
        targets = targets.long()
    tensor = torch.zeros((len(batch), *batch[0][0].shape), dtype=torch.uint8)
    for i in range(len(batch)):
        tensor[i].copy_(batch[i][0])
    return tensor, targets


# --- NVIDIA DALI, CPU only -----------------------------------------------------------------

@contextlib.contextmanager
def quiet_stderr():
    """Silences C-level stderr (DALI reports each missing GPU codec library at start-up)."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def dali_version() -> str | None:
    """DALI's version when it imports here, else None."""
    try:
        with quiet_stderr():
            import nvidia.dali as dali
    except ImportError:
        return None
    return dali.__version__


class DaliBatches:
    """A CPU-only DALI pipeline run epoch by epoch like a DataLoader: an epoch schedules
    exactly its batches (``prefetch_queue_depth`` ahead), so no work runs between epochs.

    Train: ``fn.decoders.image_random_crop`` (ROI decode of the RandomResizedCrop box) →
    ``fn.resize`` (linear, antialiased) → ``fn.flip``. Eval: full decode → ``fn.resize``
    (shorter side 256, antialiased) → ``fn.crop`` 224. Batches are copied into torch
    uint8 N×H×W×C tensors, as DALI's PyTorch iterator does.
    """

    def __init__(self, root: str, train: bool, batch_size: int, threads: int, size: int = 224,
                 seed: int = 0, depth: int = 2) -> None:
        with quiet_stderr():
            from nvidia.dali import fn, pipeline_def, types

            @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=seed,
                          prefetch_queue_depth=depth)
            def pipe():
                jpegs, labels = fn.readers.file(file_root=root, random_shuffle=train, name="reader")
                if train:
                    img = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                        random_area=list(SCALE), random_aspect_ratio=list(RATIO),
                                                        num_attempts=10)
                    img = fn.resize(img, resize_x=size, resize_y=size, antialias=True)
                    img = fn.flip(img, horizontal=fn.random.coin_flip())
                else:
                    img = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                    img = fn.resize(img, resize_shorter=int(size / 0.875), antialias=True)
                    img = fn.crop(img, crop=(size, size))
                return img, labels

            self.pipe = pipe()
            self.pipe.build()
        self.depth, self.batch_size = depth, batch_size
        self.epoch_size = self.pipe.epoch_size("reader")
        self.ahead = 0  # runs scheduled and not yet consumed

    def __len__(self) -> int:
        return math.ceil(self.epoch_size / self.batch_size)

    def _schedule(self) -> None:
        first = self.pipe._first_iter  # the first schedule_run queues `depth` runs at once
        self.pipe.schedule_run()
        self.ahead += self.depth if first else 1

    def __iter__(self):
        n = len(self)
        while self.ahead < min(self.depth, n):
            self._schedule()
        for i in range(n):
            images, labels = self.pipe.outputs()
            self.ahead -= 1
            x = torch.from_numpy(np.array(images.as_tensor()))  # copy out of DALI's buffer
            y = torch.from_numpy(np.array(labels.as_tensor())).view(-1).long()
            if i + 1 + self.ahead < n:
                self._schedule()
            yield x, y


# --- SPDL (FFmpeg decode, thread pipeline) ---------------------------------------------------

def spdl_version() -> str | None:
    """SPDL's version when its FFmpeg bindings load here, else None."""
    import io

    try:
        from importlib.metadata import version

        import spdl.io

        tiny = io.BytesIO()
        Image.new("RGB", (16, 16)).save(tiny, "JPEG")
        spdl.io.load_image(tiny.getvalue())  # loads the FFmpeg bindings, which need the system's FFmpeg
    except (ImportError, RuntimeError):
        return None
    return version("spdl")


def spdl_train_sample(data: bytes, size: int = 224) -> np.ndarray:
    """One training sample the SPDL way: timm's RandomResizedCrop box (Python's ``random``),
    then FFmpeg decode, crop, bilinear scale and flip in one call (uint8 H×W×C)."""
    import spdl.io

    from fastload.decode import image_size

    height, width = image_size(data)
    top, left, h, w = timm_rrc_params(width, height)
    flip = "hflip," if random.random() < 0.5 else ""
    desc = f"crop={w}:{h}:{left}:{top},scale={size}:{size}:flags=bilinear,{flip}format=rgb24"
    return spdl.io.to_numpy(spdl.io.load_image(data, filter_desc=desc))


class SpdlBatches:
    """SPDL's thread pipeline over the training set, epoch by epoch: read each file, decode
    and crop it with FFmpeg (``spdl_train_sample``, ``threads`` at once), batch, stack into
    uint8 N×H×W×C tensors."""

    def __init__(self, paths: list[str], labels: list[int], batch_size: int, threads: int) -> None:
        self.paths, self.labels, self.batch_size, self.threads = paths, labels, batch_size, threads

    def __len__(self) -> int:
        return math.ceil(len(self.paths) / self.batch_size)

    def _load(self, i: int):
        with open(self.paths[i], "rb") as f:
            return spdl_train_sample(f.read()), self.labels[i]

    @staticmethod
    def _collate(items):
        return torch.from_numpy(np.stack([x for x, _ in items])), torch.tensor([y for _, y in items])

    def __iter__(self):
        from spdl.pipeline import PipelineBuilder

        order = list(range(len(self.paths)))
        random.shuffle(order)
        pipeline = (
            PipelineBuilder()
            .add_source(order)
            .pipe(self._load, concurrency=self.threads)
            .aggregate(self.batch_size)
            .pipe(self._collate)
            .add_sink(3)
            .build(num_threads=self.threads)
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=600)
