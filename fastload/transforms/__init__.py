"""uint8 HWC → uint8 HWC transforms, planned from the JPEG header where they can be.

The first transform of a pipeline may be a *crop planner* (RandomResizedCrop, Resize,
Resize + CenterCrop): it chooses its crop from the header size alone, so the decode can
be planned for it: full, at a DCT scale, or only the crop's region, whichever costs
least on this machine within the antialiased tolerance (:mod:`fastload.decode.plan`).
Resizing is antialiased
bilinear by default, as in torchvision v2; ``antialias=False`` trades that for speed.
Randomness comes from the ``rng`` passed in, which the datasets derive from
(seed, epoch, sample index): output never depends on which worker ran a sample.

Your own transforms: ``f(img, rng) -> img`` (reproducible: draw only from ``rng``), or
``f(img) -> img`` (called as is; its randomness comes from global generators, seeded
per worker, so it is not reproducible per sample). albumentations: :func:`albumentations`.

Augmentations with torchvision v2's names, arguments and pixels: the operations in
:mod:`fastload.transforms.functional`; the random transforms ColorJitter, RandomGrayscale,
RandomSolarize, GaussianBlur (:mod:`.color`), RandomCrop, RandomVerticalFlip
(:mod:`.geometry`), RandAugment, TrivialAugmentWide, AutoAugment, AugMix
(:mod:`.auto_augment`).

Several views of each image, out of one planned decode (self-supervised recipes):
:class:`MultiView`, and DINO's multi-crop :func:`dino`.

timm's recipes by name: ``train(224, auto_augment="rand-m9-mstd0.5-inc1", color_jitter=0.4)``
and ``eval(224, crop_pct=0.9)`` take timm's ``transforms_imagenet_train``/``_eval`` arguments;
:func:`timm_augment` builds timm's RandAugment / AutoAugment / AugMix from its strings
(:mod:`.timm_policies`, parsed by :mod:`.timm_config`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..decode.resize import Crop, resize  # noqa: F401  (resize: re-exported)
from . import functional
from .adapters import Albumentations, albumentations
from .auto_augment import AugMix, AutoAugment, AutoAugmentPolicy, RandAugment, TrivialAugmentWide
from .color import ColorJitter, GaussianBlur, RandomGrayscale, RandomSolarize
from .compose import Compose, DecodeSteps, as_compose, takes_rng
from .crops import CenterCrop, CropPlanner, RandomHorizontalFlip, RandomResizedCrop, Resize, ResizedCenterCrop
from .foreign import equivalent as _equivalent
from .geometry import RandomCrop, RandomVerticalFlip
from .multiview import MultiView, ViewSteps
from .presets import eval, train  # noqa: A004
from .random_apply import RandomApply
from .single_ops import (
    Grayscale,
    Pad,
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomInvert,
    RandomPosterize,
)
from .ssl import dino
from .timm_config import parse_auto_augment
from .timm_policies import TimmAugMix, TimmAutoAugment, TimmOp, TimmRandAugment, timm_augment

__all__ = [
    "AugMix",
    "AutoAugment",
    "AutoAugmentPolicy",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "Crop",
    "DecodeSteps",
    "GaussianBlur",
    "Grayscale",
    "MultiView",
    "Pad",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomApply",
    "RandomAutocontrast",
    "RandomCrop",
    "RandomEqualize",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomSolarize",
    "RandomVerticalFlip",
    "Resize",
    "ResizedCenterCrop",
    "TimmAugMix",
    "TimmAutoAugment",
    "TimmOp",
    "TimmRandAugment",
    "TrivialAugmentWide",
    "ViewSteps",
    "albumentations",
    "dino",
    "eval",
    "functional",
    "parse_auto_augment",
    "takes_rng",
    "timm_augment",
    "train",
]


if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any name here

    def __getattr__(name: str) -> object:
        # fl.transforms.Normalize / ToTensor / MixUp ... typed by torchvision habit: say where it went.
        instead = _equivalent(name)
        hint = f" (torchvision's {name}: {instead})" if instead is not None else ""
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}{hint}")
