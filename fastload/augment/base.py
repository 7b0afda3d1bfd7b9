"""What every fastload batch transform shares: the calling convention, and the checks of its input."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from .mixing import MixParams, mix_images, mix_targets
from .sampling import fresh_generator


def check_images(images: Any, who: str) -> torch.Tensor:
    """``images`` if it is a floating N×C×H×W tensor, else the error that says why not."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"{who} takes an N×C×H×W image tensor, got {type(images).__name__}")
    if images.dim() != 4:
        raise ValueError(f"{who} takes an N×C×H×W image batch, got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise TypeError(
            f"{who} takes normalized floating-point images, got {images.dtype} "
            "(the Loader delivers uint8 only with normalize=False)"
        )
    return images


def number(
    name: str, value: Any, low: float, high: float | None = None, *, open_low: bool = False, open_high: bool = False
) -> float:
    """``value`` as a float in its range, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    too_low = v <= low if open_low else v < low
    too_high = high is not None and (v >= high if open_high else v > high)
    if too_low or too_high or not math.isfinite(v):  # inf passes an open upper end, then fails every batch
        lo, hi = "(" if open_low else "[", ")" if open_high else "]"
        within = f"{lo}{low}, inf)" if high is None else f"{lo}{low}, {high}{hi}"
        raise ValueError(f"{name} must be a finite number in {within}, got {value!r}")
    return v


def count(name: str, value: Any, low: int) -> int:
    """``value`` as an int >= ``low``, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


class MixingTransform:
    """A Mixup/CutMix family transform: draws :class:`MixParams`, then mixes pixels and targets.

    Subclasses set ``partner`` ("flip": timm's mirrored pairs; "roll": torchvision's
    consecutive ones) and implement :meth:`draw` and :meth:`soft_targets`.
    """

    partner = "flip"

    def draw(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> MixParams:
        """The parameters of one batch: one row (the whole batch) or one per sample."""
        raise NotImplementedError

    def soft_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """The float32 N × C targets before mixing."""
        raise NotImplementedError

    def __call__(
        self, images: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixes ``images`` in place (as timm's) and returns them with the mixed targets.

        Args:
            images: Floating N×C×H×W (any memory format; channels_last is kept).
            targets: The batch's targets (see the class).
            generator: Where the draws come from (the Loader passes one seeded from (seed,
                epoch, batch)); None: one seeded from torch's default generator.

        Returns:
            (images, targets): images of the input's dtype and layout; targets float32 N × C.
        """
        who = type(self).__name__
        images = check_images(images, who)
        if not isinstance(targets, torch.Tensor) or targets.dim() == 0 or targets.shape[0] != images.shape[0]:
            shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise ValueError(f"{who}: targets must be a tensor with one row per image ({images.shape[0]}), got {shape}")
        soft = self.soft_targets(targets)
        generator = generator if generator is not None else fresh_generator(images.device)
        params = self.draw(images.shape[0], images.shape[-2], images.shape[-1], generator).to(images.device)
        mixed, lam = mix_images(images, params, self.partner)
        return mixed, mix_targets(soft, lam, self.partner)
