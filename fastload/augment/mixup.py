"""timm's Mixup/CutMix (``timm.data.Mixup``) as a fastload batch transform, drawn on the device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .base import MixingTransform, count, number
from .mixing import MixParams, box_lam, one_hot
from .sampling import beta, integers, uniform

MODES = ("batch", "pair", "elem")


def _minmax(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    if not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"cutmix_minmax must be None or (min, max) fractions of the image side, got {value!r}")
    low = number("cutmix_minmax[0]", value[0], 0.0, 1.0)
    high = number("cutmix_minmax[1]", value[1], 0.0, 1.0)
    if low >= high:
        raise ValueError(f"cutmix_minmax must have min < max, got {value!r}")
    return low, high


def alpha_box(lam: torch.Tensor, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """timm's CutMix box for each λ: sides ``int(side · sqrt(1 - λ))`` around a uniform
    pixel centre, clipped to the image; int64 (y0, y1, x0, x1) rows."""
    ratio = torch.sqrt(1.0 - lam)
    cut_h, cut_w = (height * ratio).floor().long(), (width * ratio).floor().long()
    cy = integers(0, height, lam.shape, generator)
    cx = integers(0, width, lam.shape, generator)
    return torch.stack(
        [
            (cy - cut_h // 2).clamp(0, height),
            (cy + (cut_h + 1) // 2).clamp(0, height),
            (cx - cut_w // 2).clamp(0, width),
            (cx + (cut_w + 1) // 2).clamp(0, width),
        ],
        dim=1,
    )


def minmax_box(
    minmax: tuple[float, float], rows: int, height: int, width: int, generator: torch.Generator
) -> torch.Tensor:
    """timm's min-max CutMix box: each side a uniform int in [side·min, side·max), placed
    uniformly inside the image; int64 (y0, y1, x0, x1) rows."""
    sides = []
    for side in (height, width):
        low, high = int(side * minmax[0]), int(side * minmax[1])
        if low >= high:
            raise ValueError(
                f"cutmix_minmax={minmax} leaves no box size to draw on a side of {side} pixels "
                f"(int({side}·min) = {low} >= int({side}·max) = {high})"
            )
        sides.append(integers(low, high, (rows,), generator))
    cut_h, cut_w = sides
    y0 = integers(0, height - cut_h + 1, (rows,), generator)
    x0 = integers(0, width - cut_w + 1, (rows,), generator)
    return torch.stack([y0, y0 + cut_h, x0, x0 + cut_w], dim=1)


class Mixup(MixingTransform):
    """Mixup and CutMix with timm's arguments and meaning (``timm.data.Mixup``).

    Sample ``i`` is mixed with sample ``N-1-i``. With probability ``prob`` (per batch, pair
    or element, by ``mode``) a sample is mixed: by CutMix with probability ``switch_prob``
    when both are active, else by Mixup. Mixup blends the two images with λ ~
    Beta(mixup_alpha, mixup_alpha); CutMix pastes the partner's pixels into a box of area
    about ``(1 - λ)`` of the image, λ ~ Beta(cutmix_alpha, cutmix_alpha) (or a box of
    ``cutmix_minmax`` side fractions), and with ``correct_lam`` sets λ to the area the
    clipped box leaves. Targets become ``λ · y + (1 - λ) · y_partner`` with ``y`` the
    label-smoothed one-hot of each class index.

    Unlike timm's, every draw is made on the batch's device from the generator given (no
    host sync, no per-sample Python loop on a device), and an odd batch
    is accepted (its middle sample is paired with itself, so it stays unchanged).
    ``mixup_enabled = False`` (what timm's training script sets at ``--mixup-off-epoch``)
    leaves images unmixed and only smooths the targets.

    Args:
        mixup_alpha: Beta parameter of Mixup; Mixup is active when > 0.
        cutmix_alpha: Beta parameter of CutMix; CutMix is active when > 0.
        cutmix_minmax: (min, max) box side as fractions of the image side; activates
            CutMix (its λ is then always the box's).
        prob: Probability that a batch / pair / element is mixed.
        switch_prob: Probability of CutMix rather than Mixup when both are active.
        mode: "batch" (one draw for the batch), "pair" (one per mirrored pair) or "elem"
            (one per sample).
        correct_lam: Set CutMix's λ to the area left by the box clipped at the border.
        label_smoothing: Smoothing of the one-hot targets before mixing.
        num_classes: Classes of the class-index targets.
        multi_label: Targets are dense N × num_classes multi-labels, smoothed towards 0.5.

    Raises:
        ValueError: A bad argument (the message names it), or neither Mixup nor CutMix active.
    """

    def __init__(
        self,
        mixup_alpha: float = 1.0,
        cutmix_alpha: float = 0.0,
        cutmix_minmax: Sequence[float] | None = None,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        mode: str = "batch",
        correct_lam: bool = True,
        label_smoothing: float = 0.1,
        num_classes: int = 1000,
        multi_label: bool = False,
    ) -> None:
        self.mixup_alpha = number("mixup_alpha", mixup_alpha, 0.0)
        self.cutmix_alpha = number("cutmix_alpha", cutmix_alpha, 0.0)
        self.cutmix_minmax = _minmax(cutmix_minmax)
        if self.cutmix_minmax is not None:
            self.cutmix_alpha = 1.0  # as timm: minmax activates CutMix; its λ is the box's
        if self.mixup_alpha == 0 and self.cutmix_alpha == 0:
            raise ValueError(
                "Mixup needs mixup_alpha > 0, cutmix_alpha > 0 or cutmix_minmax; got "
                f"mixup_alpha={mixup_alpha!r}, cutmix_alpha={cutmix_alpha!r}, cutmix_minmax=None"
            )
        self.mix_prob = number("prob", prob, 0.0, 1.0)
        self.switch_prob = number("switch_prob", switch_prob, 0.0, 1.0)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        for name, flag in (("correct_lam", correct_lam), ("multi_label", multi_label)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        self.correct_lam = correct_lam
        self.multi_label = multi_label
        self.label_smoothing = number("label_smoothing", label_smoothing, 0.0, 1.0)
        self.num_classes = count("num_classes", num_classes, 1)
        self.mixup_enabled = True  # timm's switch for turning mixing off in later epochs

    def draw(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> MixParams:
        """The parameters of one batch: one row in "batch" mode, else one per sample."""
        rows = 1 if self.mode == "batch" else batch_size // 2 if self.mode == "pair" else batch_size
        shape = (rows,)
        mixed = uniform(shape, generator) < self.mix_prob
        if not self.mixup_enabled:
            mixed = torch.zeros_like(mixed)
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = uniform(shape, generator) < self.switch_prob
            lam = torch.where(
                use_cutmix, beta(self.cutmix_alpha, shape, generator), beta(self.mixup_alpha, shape, generator)
            )
        else:
            use_cutmix = torch.full(shape, self.cutmix_alpha > 0, device=generator.device)
            lam = beta(max(self.mixup_alpha, self.cutmix_alpha), shape, generator)
        cutmix = use_cutmix & mixed
        lam = torch.where(mixed, lam, 1.0)
        if self.cutmix_minmax is not None:
            box = minmax_box(self.cutmix_minmax, rows, height, width, generator)
        else:
            box = alpha_box(lam, height, width, generator)
        if self.correct_lam or self.cutmix_minmax is not None:
            lam = torch.where(cutmix, box_lam(box, height, width), lam)
        params = MixParams(lam, cutmix, box)
        return params.mirrored(batch_size) if self.mode == "pair" else params

    def soft_targets(self, targets: torch.Tensor) -> torch.Tensor:
        if self.multi_label:
            if targets.dim() != 2 or targets.shape[1] != self.num_classes:
                raise ValueError(
                    f"Mixup(multi_label=True) takes dense targets N × num_classes "
                    f"({self.num_classes}), got shape {tuple(targets.shape)}"
                )
            return targets.float() * (1.0 - self.label_smoothing) + 0.5 * self.label_smoothing
        if targets.dim() != 1 or targets.is_floating_point():
            raise TypeError(
                f"Mixup takes class-index targets (an integer tensor of N), got {targets.dtype} "
                f"{tuple(targets.shape)}; for N × C targets use multi_label=True (timm's dense "
                "multi-labels) or fl.augment.MixUp/CutMix (torchvision's, which mix probabilities)"
            )
        return one_hot(targets, self.num_classes, self.label_smoothing)

    def __repr__(self) -> str:
        return (
            f"Mixup(mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, cutmix_minmax="
            f"{self.cutmix_minmax}, prob={self.mix_prob}, switch_prob={self.switch_prob}, mode={self.mode!r}, "
            f"label_smoothing={self.label_smoothing}, num_classes={self.num_classes})"
        )
