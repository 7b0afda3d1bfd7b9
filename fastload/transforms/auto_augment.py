"""Automatic augmentation policies with torchvision v2's names, arguments, operation
lists, magnitude bins and probabilities: RandAugment, TrivialAugmentWide, AutoAugment,
AugMix. Each draws only from the sample's ``rng`` and applies
:mod:`fastload.transforms.functional` operations to the uint8 H×W×C (or grayscale) image.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import numpy as np

from ._augment_ops import (
    AUGMIX_ALL,
    AUGMIX_PARTIAL,
    AUTO_AUGMENT,
    RAND_AUGMENT,
    TRIVIAL_AUGMENT_WIDE,
    Space,
    apply_op,
    has_magnitude,
    signed_magnitude,
)
from ._policies import POLICIES
from .functional._utils import Fill, check_fill, interpolation_name
from .settings import Settings


class AutoAugmentPolicy(enum.Enum):
    """AutoAugment's learned policies (torchvision's AutoAugmentPolicy values)."""

    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"


def _int_arg(value: Any, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return int(value)


class _AutoAugmentBase(Settings):
    """Validates and keeps ``interpolation`` ('nearest' or 'bilinear') and ``fill``."""

    space: Space

    def __init__(self, interpolation: Any, fill: Fill) -> None:
        self.interpolation = interpolation_name(interpolation)
        self.fill = check_fill(fill)

    def _op(self, rng: np.random.Generator) -> str:
        ops = tuple(self.space)
        return ops[int(rng.integers(len(ops)))]

    def _apply(self, img: np.ndarray, op: str, magnitude: float) -> np.ndarray:
        return apply_op(img, op, magnitude, self.interpolation, self.fill)


class RandAugment(_AutoAugmentBase):
    """``num_ops`` operations drawn uniformly (with replacement) from 14, each at bin
    ``magnitude`` of ``num_magnitude_bins``, signed at random (Cubuk et al. 2020).

    Args:
        num_ops: Operations per image (>= 0).
        magnitude: The magnitude bin, in [0, num_magnitude_bins).
        num_magnitude_bins: Bins spanning each operation's range (>= 2).
        interpolation: 'nearest' (default) or 'bilinear' for the geometric operations.
        fill: Value of pixels from outside the image (a number or one per channel).
    """

    space = RAND_AUGMENT

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        interpolation: Any = "nearest",
        fill: Fill = None,
    ) -> None:
        super().__init__(interpolation, fill)
        self.num_ops = _int_arg(num_ops, "num_ops", 0)
        self.num_magnitude_bins = _int_arg(num_magnitude_bins, "num_magnitude_bins", 2)
        self.magnitude = _int_arg(magnitude, "magnitude", 0, self.num_magnitude_bins - 1)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = img.shape[:2]
        for _ in range(self.num_ops):
            op = self._op(rng)
            magnitude = signed_magnitude(self.space, op, self.num_magnitude_bins, self.magnitude, h, w, rng)
            img = self._apply(img, op, magnitude)
        return img

    def __repr__(self) -> str:
        return (
            f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, "
            f"num_magnitude_bins={self.num_magnitude_bins}, interpolation={self.interpolation!r})"
        )


class TrivialAugmentWide(_AutoAugmentBase):
    """One operation drawn uniformly from 14, at a uniformly drawn bin of the wide ranges,
    signed at random (Müller & Hutter 2021).

    Args:
        num_magnitude_bins: Bins spanning each operation's range (>= 2).
        interpolation: 'nearest' (default) or 'bilinear' for the geometric operations.
        fill: Value of pixels from outside the image (a number or one per channel).
    """

    space = TRIVIAL_AUGMENT_WIDE

    def __init__(self, num_magnitude_bins: int = 31, interpolation: Any = "nearest", fill: Fill = None) -> None:
        super().__init__(interpolation, fill)
        self.num_magnitude_bins = _int_arg(num_magnitude_bins, "num_magnitude_bins", 2)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = img.shape[:2]
        op = self._op(rng)
        index = int(rng.integers(self.num_magnitude_bins)) if has_magnitude(self.space, op) else 0
        magnitude = signed_magnitude(self.space, op, self.num_magnitude_bins, index, h, w, rng)
        return self._apply(img, op, magnitude)

    def __repr__(self) -> str:
        return f"TrivialAugmentWide(num_magnitude_bins={self.num_magnitude_bins}, interpolation={self.interpolation!r})"


class AutoAugment(_AutoAugmentBase):
    """One of the policy's 25 sub-policies drawn uniformly; each of its two steps applied
    with its probability at its magnitude bin (of 10), signed at random (Cubuk et al. 2019).

    Args:
        policy: AutoAugmentPolicy.IMAGENET (default), CIFAR10 or SVHN (torchvision's enum or
            its value, e.g. 'imagenet', are accepted too).
        interpolation: 'nearest' (default) or 'bilinear' for the geometric operations.
        fill: Value of pixels from outside the image (a number or one per channel).
    """

    space = AUTO_AUGMENT

    def __init__(
        self, policy: Any = AutoAugmentPolicy.IMAGENET, interpolation: Any = "nearest", fill: Fill = None
    ) -> None:
        super().__init__(interpolation, fill)
        value = getattr(policy, "value", policy)
        if value not in POLICIES:
            raise ValueError(
                f"policy must be one of {[p.value for p in AutoAugmentPolicy]} (or AutoAugmentPolicy), got {policy!r}"
            )
        self.policy = AutoAugmentPolicy(value)
        self.policies = POLICIES[value]

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = img.shape[:2]
        for op, probability, index in self.policies[int(rng.integers(len(self.policies)))]:
            if not rng.random() <= probability:
                continue
            magnitude = signed_magnitude(self.space, op, 10, index or 0, h, w, rng)
            img = self._apply(img, op, magnitude)
        return img

    def __repr__(self) -> str:
        return f"AutoAugment(policy={self.policy}, interpolation={self.interpolation!r})"


class AugMix(_AutoAugmentBase):
    """A convex mix of the image with ``mixture_width`` chains of 1-3 (or ``chain_depth``)
    random operations at severity up to ``severity``, Dirichlet and Beta weighted
    (Hendrycks et al. 2020).

    Args:
        severity: Highest magnitude bin (of 10) an operation draws, in [1, 10].
        mixture_width: Number of chains (>= 1).
        chain_depth: Operations per chain; <= 0 draws 1-3 per chain.
        alpha: Dirichlet and Beta concentration (> 0).
        all_ops: Include brightness, contrast, colour and sharpness.
        interpolation: 'bilinear' (default) or 'nearest' for the geometric operations.
        fill: Value of pixels from outside the image (a number or one per channel).
    """

    def __init__(
        self,
        severity: int = 3,
        mixture_width: int = 3,
        chain_depth: int = -1,
        alpha: float = 1.0,
        all_ops: bool = True,
        interpolation: Any = "bilinear",
        fill: Fill = None,
    ) -> None:
        super().__init__(interpolation, fill)
        self.severity = _int_arg(severity, "severity", 1, 10)
        self.mixture_width = _int_arg(mixture_width, "mixture_width", 1)
        if isinstance(chain_depth, bool) or not isinstance(chain_depth, (int, np.integer)):
            raise TypeError(f"chain_depth must be an int, got {chain_depth!r}")
        self.chain_depth = int(chain_depth)
        if not alpha > 0 or not math.isfinite(alpha):
            raise ValueError(f"alpha must be positive and finite, got {alpha!r}")
        self.alpha = float(alpha)
        self.all_ops = bool(all_ops)

    @property
    def space(self) -> Space:  # type: ignore[override]  # chosen by all_ops; a property keeps instances picklable
        return AUGMIX_ALL if self.all_ops else AUGMIX_PARTIAL

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = img.shape[:2]
        # Beta(alpha, alpha) as a 2-way Dirichlet: the original's weight, then the chains'.
        keep, rest = rng.dirichlet([self.alpha, self.alpha])
        weights = rng.dirichlet([self.alpha] * self.mixture_width) * rest
        mix = img.astype(np.float32) * np.float32(keep)
        for weight in weights:
            aug = img
            depth = self.chain_depth if self.chain_depth > 0 else int(rng.integers(1, 4))
            for _ in range(depth):
                op = self._op(rng)
                index = int(rng.integers(self.severity)) if has_magnitude(self.space, op) else 0
                aug = self._apply(aug, op, signed_magnitude(self.space, op, 10, index, h, w, rng))
            mix += np.float32(weight) * aug
        # torchvision truncates the float mix to uint8.
        return mix.astype(np.uint8)

    def __repr__(self) -> str:
        return (
            f"AugMix(severity={self.severity}, mixture_width={self.mixture_width}, "
            f"chain_depth={self.chain_depth}, alpha={self.alpha}, all_ops={self.all_ops}, "
            f"interpolation={self.interpolation!r})"
        )
