"""The train and eval pipelines of ImageNet-style training, with timm's arguments.

``train(224, auto_augment="rand-m9-mstd0.5-inc1", ...)`` is the per-sample part of timm's
``transforms_imagenet_train`` and ``eval(224, crop_pct=0.875)`` its
``transforms_imagenet_eval``. What timm does after the per-sample transforms belongs to
fastload's later stages: conversion and normalisation to the Loader (``mean=``, ``std=``),
Mixup/CutMix and RandomErasing to its batch stage, in timm's order (its prefetcher mixes, then
erases: ``fl.Loader(..., batch_transform=[fl.augment.Mixup(...), fl.augment.RandomErasing(...)])``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch

from ..decode.resize import Crop, resize
from .color import ColorJitter, GaussianBlur, RandomGrayscale
from .compose import Compose
from .crops import CropPlanner, RandomHorizontalFlip, RandomResizedCrop, ResizedCenterCrop, _pair
from .functional._utils import finite
from .geometry import RandomVerticalFlip
from .random_apply import RandomApply
from .settings import Settings
from .timm_policies import IMAGENET_MEAN, timm_augment

INTERPOLATIONS = ("bilinear", "bicubic", "random")
_ERASING_HINT = (
    "RandomErasing runs on the normalized batch in fastload: pass "
    "fl.Loader(..., batch_transform=fl.augment.RandomErasing({p}, mode='pixel', device=...)) "
    "(timm's re_prob/re_mode/re_count are its probability/mode/max_count), after any fl.augment.Mixup "
    "in the list, as timm's prefetcher erases the mixed batch"
)


def _check_interpolation(interpolation: str) -> None:
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")


def _check_probabilities(**probabilities: float | None) -> None:
    """Each of ``probabilities`` is None or in [0, 1] (nan is not: ``nan > 0`` is False, so it
    would turn its step off without a word)."""
    for name, p in probabilities.items():
        if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1):
            raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")


def _jitter_steps(color_jitter: float | Sequence[float], color_jitter_prob: float | None) -> list:
    finite("color_jitter", color_jitter if isinstance(color_jitter, (int, float)) else tuple(color_jitter))
    if isinstance(color_jitter, (int, float)):
        factors: tuple[float, ...] = (float(color_jitter),) * 3  # timm: a scalar jitters no hue
    else:
        factors = tuple(float(v) for v in color_jitter)
    if len(factors) not in (3, 4):
        raise ValueError(
            f"color_jitter must be a number or 3 or 4 factors (brightness, contrast, saturation"
            f"[, hue]), got {color_jitter!r}"
        )
    jitter = ColorJitter(*factors)
    return [jitter if color_jitter_prob is None else RandomApply([jitter], color_jitter_prob)]


def train(
    size: int | Sequence[int] = 224,
    scale: Sequence[float] = (0.08, 1.0),
    flip: bool = True,
    reduced_decode: bool = True,
    antialias: bool = True,
    *,
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    hflip: float | None = None,
    vflip: float = 0.0,
    auto_augment: str | None = None,
    color_jitter: float | Sequence[float] | None = None,
    color_jitter_prob: float | None = None,
    force_color_jitter: bool = False,
    grayscale_prob: float = 0.0,
    gaussian_blur_prob: float = 0.0,
    interpolation: str = "random",
    mean: Sequence[float] = IMAGENET_MEAN,
    re_prob: float = 0.0,
    train_crop_mode: str | None = None,
) -> Compose:
    """RandomResizedCrop and flips, then timm's auto-augment or color jitter.

    Called as before (``train(224)``) it is RandomResizedCrop + horizontal flip. The
    keyword-only arguments are timm's ``transforms_imagenet_train``'s, with its meaning:
    e.g. ``train(224, auto_augment="rand-m9-mstd0.5-inc1", color_jitter=0.4)`` is timm's
    default recipe (its color jitter is skipped when an auto-augment is set, as in timm).

    Args:
        size: Output size, an int or (height, width) (timm's ``img_size``).
        scale: RandomResizedCrop's area range.
        flip: Horizontal flip at p=0.5 (``hflip`` overrides it).
        reduced_decode: Let the crop decode JPEGs at a reduced DCT scale.
        antialias: Antialiased bilinear crop resize (False: OpenCV's bilinear, faster).
        ratio: RandomResizedCrop's aspect-ratio range.
        hflip: Horizontal flip probability (timm's name; None: 0.5 if ``flip`` else 0).
        vflip: Vertical flip probability.
        auto_augment: timm's string: ``"rand-m9-mstd0.5-inc1"``, ``"augmix-m5-w4-d2"``,
            ``"original"``, ``"v0"``, … (see :mod:`fastload.transforms.timm_policies`).
        color_jitter: Brightness/contrast/saturation factor, or 3 or 4 factors (with
            hue), as torchvision's ColorJitter. None: none (timm's default is 0.4: pass it).
            Skipped when ``auto_augment`` is set, unless ``force_color_jitter`` or a ``3a`` policy.
        color_jitter_prob: Apply the jitter with this probability (None: always).
        force_color_jitter: Jitter even with an auto-augment.
        grayscale_prob: RandomGrayscale's probability.
        gaussian_blur_prob: Probability of timm's GaussianBlur(kernel_size=23, sigma 0.1–2).
        interpolation: ``"bilinear"``, ``"bicubic"`` or ``"random"`` (timm's default): the
            kernel of the auto-augment's rotations, shears and translations. The crop's
            resize is antialiased bilinear whichever is chosen (timm's ``random`` also
            draws bicubic for the crop).
        mean: Normalisation mean, for the fill of pixels the auto-augment uncovers
            (``round(255 * mean)``, as timm); normalisation itself is the Loader's.
        re_prob: Must be 0: RandomErasing is a batch transform here (the error says how).
        train_crop_mode: ``None`` or ``"rrc"`` (timm's other modes are not implemented).

    Raises:
        ValueError: A bad value, ``re_prob > 0``, or an unknown auto-augment string.
    """
    if re_prob:
        raise ValueError(f"re_prob={re_prob!r}: " + _ERASING_HINT.format(p=re_prob))
    if train_crop_mode not in (None, "rrc"):
        raise ValueError(f"train_crop_mode={train_crop_mode!r} is not implemented; only 'rrc' (RandomResizedCrop)")
    _check_interpolation(interpolation)
    _check_probabilities(
        hflip=hflip,
        vflip=vflip,
        color_jitter_prob=color_jitter_prob,
        grayscale_prob=grayscale_prob,
        gaussian_blur_prob=gaussian_blur_prob,
    )
    finite("mean", tuple(mean))
    hflip = (0.5 if flip else 0.0) if hflip is None else hflip
    ts: list = [RandomResizedCrop(size, scale=scale, ratio=ratio, antialias=antialias)]
    if hflip > 0:
        ts.append(RandomHorizontalFlip(hflip))
    if vflip > 0:
        ts.append(RandomVerticalFlip(vflip))
    jitter = color_jitter is not None
    if auto_augment:
        ts.append(timm_augment(auto_augment, _pair(size, "size"), mean, interpolation))
        jitter = jitter and (force_color_jitter or "3a" in auto_augment)
    if jitter and color_jitter is not None:
        ts += _jitter_steps(color_jitter, color_jitter_prob)
    if grayscale_prob:
        ts.append(RandomGrayscale(grayscale_prob))
    if gaussian_blur_prob:
        ts.append(RandomApply([GaussianBlur(23, (0.1, 2.0))], gaussian_blur_prob))
    return Compose(ts, reduced_decode)


class SquashCenterCrop(CropPlanner):
    """timm's ``crop_mode="squash"``: both sides resized to ``resize`` (the aspect ratio
    not kept), then the centre ``size`` cropped, as one window of the whole image."""

    def __init__(self, size: int | Sequence[int], resize: int | Sequence[int], antialias: bool = True) -> None:
        self.size, self.resize, self.antialias = _pair(size, "size"), _pair(resize, "resize"), bool(antialias)
        if self.size[0] > self.resize[0] or self.size[1] > self.resize[1]:
            raise ValueError(f"crop {self.size} is larger than the resize {self.resize}")

    def plan(self, h: int, w: int, rng: np.random.Generator | None) -> Crop:
        (rh, rw), (ch, cw) = self.resize, self.size
        sy, sx = h / rh, w / rw
        top, left = int(round((rh - ch) / 2)), int(round((rw - cw) / 2))
        return Crop(top * sy, left * sx, ch * sy, cw * sx, ch, cw, self.antialias, window=True)

    def __repr__(self) -> str:
        return f"SquashCenterCrop(size={self.size}, resize={self.resize}, antialias={self.antialias})"


def _resize_whole(img: np.ndarray, rh: int, rw: int, interpolation: str) -> np.ndarray:
    """The whole image resized, antialiased: bilinear (fastload's resize) or bicubic (Pillow's filter)."""
    if interpolation == "bilinear":
        return resize(np.ascontiguousarray(img), rh, rw)
    t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).unsqueeze(0)
    return torch.ops.aten._upsample_bicubic2d_aa(t, [rh, rw], False, None, None)[0].permute(1, 2, 0).numpy()


class BorderCenterCrop(Settings):
    """timm's ``crop_mode="border"``: the longer side resized to fit ``resize`` (aspect
    kept), padded with ``fill`` to at least ``size``, then the centre ``size`` cropped.

    Args:
        size: The output, (height, width).
        resize: (height, width) the image is fitted into.
        fill: The padding colour, one value per channel.
        interpolation: ``"bilinear"`` or ``"bicubic"`` (antialiased).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        resize: int | Sequence[int],
        fill: Sequence[int],
        interpolation: str = "bilinear",
    ) -> None:
        self.size, self.resize = _pair(size, "size"), _pair(resize, "resize")
        self.fill, self.interpolation = np.asarray(fill, np.uint8), interpolation

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        h, w = img.shape[:2]
        ratio = max(h / self.resize[0], w / self.resize[1])  # timm's ResizeKeepRatio(longest=1)
        rh, rw = max(1, round(h / ratio)), max(1, round(w / ratio))
        img = _resize_whole(img, rh, rw, self.interpolation)
        ch, cw = self.size
        if ch > rh or cw > rw:  # padded centred, the odd pixel at the bottom / right
            out = np.empty((max(ch, rh), max(cw, rw), img.shape[2]), np.uint8)
            out[...] = self.fill[: img.shape[2]]
            top, left = max(0, (ch - rh) // 2), max(0, (cw - rw) // 2)
            out[top : top + rh, left : left + rw] = img
            img = out
        top, left = int(round((img.shape[0] - ch) / 2)), int(round((img.shape[1] - cw) / 2))
        return img[top : top + ch, left : left + cw]

    def __repr__(self) -> str:
        return f"BorderCenterCrop(size={self.size}, resize={self.resize}, interpolation={self.interpolation!r})"


class BicubicCenterCrop(Settings):
    """Resize (bicubic, antialiased: Pillow's filter, as torchvision v2) then centre crop.

    Not a crop planner: the image is decoded whole and resized whole, slower than the
    bilinear planned decode, for models whose eval transform is bicubic.

    Args:
        size: The crop, (height, width).
        resize: The shorter side (an int), or (height, width) to squash to.
    """

    def __init__(self, size: int | Sequence[int], resize: int | Sequence[int]) -> None:
        self.size = _pair(size, "size")
        self.resize = resize if isinstance(resize, int) else _pair(resize, "resize")

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        h, w = img.shape[:2]
        if isinstance(self.resize, int):  # torchvision's Resize(int): the longer side truncated
            r = self.resize
            rh, rw = (r, int(r * w / h)) if h <= w else (int(r * h / w), r)
        else:
            rh, rw = self.resize
        out = _resize_whole(img, rh, rw, "bicubic")
        ch, cw = self.size
        if ch > rh or cw > rw:
            raise ValueError(f"crop {self.size} is larger than the {rh}x{rw} resize")
        top, left = int(round((rh - ch) / 2)), int(round((rw - cw) / 2))
        return out[top : top + ch, left : left + cw]

    def __repr__(self) -> str:
        return f"BicubicCenterCrop(size={self.size}, resize={self.resize})"


def eval(
    size: int | Sequence[int] = 224,
    resize: int | None = None,
    reduced_decode: bool = True,
    antialias: bool = True,
    *,
    crop_pct: float | None = None,
    crop_mode: str | None = None,
    interpolation: str = "bilinear",
    mean: Sequence[float] = IMAGENET_MEAN,
) -> Compose:
    """Resize then centre-crop ``size``: timm's ``transforms_imagenet_eval``.

    The resize is ``resize`` (the shorter side), else ``floor(size / crop_pct)`` with timm's
    default crop_pct 0.875 (224 → 256). Antialiased, it matches torchvision's Resize +
    CenterCrop on PIL images to within rounding; ``antialias=False`` is the faster OpenCV
    bilinear.

    Args:
        size: Output size, an int or (height, width).
        resize: Shorter side before the crop (not with ``crop_pct``).
        reduced_decode: Let the crop decode JPEGs at a reduced DCT scale.
        antialias: Antialiased bilinear resize.
        crop_pct: The fraction of the resized image the crop keeps (timm's).
        crop_mode: ``"center"`` (default: aspect kept), ``"squash"`` (both sides
            resized to ``size / crop_pct``) or ``"border"`` (the whole image fitted into
            ``size / crop_pct``, padded with the mean colour; not planned from the header).
        interpolation: ``"bilinear"`` (antialiased, planned from the header: the decode is
            reduced) or ``"bicubic"`` (antialiased, Pillow's filter, on the full decode:
            slower). ``antialias`` applies to bilinear only.
        mean: The normalisation mean: ``"border"``'s padding is ``round(255 * mean)``, as timm's.
    """
    if interpolation not in ("bilinear", "bicubic"):
        raise ValueError(f"interpolation must be 'bilinear' or 'bicubic', got {interpolation!r}")
    if crop_mode not in (None, "center", "squash", "border"):
        raise ValueError(f"crop_mode must be 'center', 'squash' or 'border', got {crop_mode!r}")
    if resize is not None and crop_pct is not None:
        raise ValueError(f"give resize={resize!r} or crop_pct={crop_pct!r}, not both")
    if crop_pct is not None and not 0 < crop_pct <= 1:
        raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct!r}")
    finite("mean", tuple(mean))
    size_hw = _pair(size, "size")
    pct = 0.875 if crop_pct is None else crop_pct
    if crop_mode in ("squash", "border"):
        scale = (resize, resize) if resize is not None else tuple(math.floor(s / pct) for s in size_hw)
        if crop_mode == "border":
            fill = [round(255 * v) for v in mean]
            return Compose([BorderCenterCrop(size_hw, scale, fill, interpolation)], reduced_decode)
        if interpolation == "bicubic":
            return Compose([BicubicCenterCrop(size_hw, scale)], reduced_decode)
        return Compose([SquashCenterCrop(size_hw, scale, antialias)], reduced_decode)
    if resize is None:
        # timm floors; round() was this function's rule, kept where they differ (the default is 256 either way).
        resize = math.floor(max(size_hw) / pct) if crop_pct is not None else int(round(max(size_hw) / 0.875))
    if interpolation == "bicubic":
        return Compose([BicubicCenterCrop(size_hw, resize)], reduced_decode)
    return Compose([ResizedCenterCrop(size_hw, resize, antialias)], reduced_decode)
