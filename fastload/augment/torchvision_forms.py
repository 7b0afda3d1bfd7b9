"""torchvision's ``MixUp``, ``CutMix`` and ``RandomChoice([MixUp, CutMix])`` as fastload batch transforms.

torchvision pairs each sample with the one before it (``roll``), draws one λ per batch,
does not smooth labels, and mixes 2-D probability labels as they are. Its CutMix box has
half-sides ``int(0.5 · sqrt(1 - λ) · side)`` around a uniform centre, clipped, and λ is
always corrected to the clipped box's area.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .base import MixingTransform, count, number
from .mixing import MixParams, box_lam, one_hot
from .sampling import beta, integers, uniform


class _TorchvisionMix(MixingTransform):
    partner = "roll"

    def __init__(self, *, alpha: float = 1.0, num_classes: int | None = None, labels_getter: Any = "default") -> None:
        self.alpha = number("alpha", alpha, 0.0, open_low=True)
        self.num_classes = None if num_classes is None else count("num_classes", num_classes, 1)
        if labels_getter != "default":
            raise ValueError(
                f"labels_getter={labels_getter!r}: fastload hands the batch's targets to the "
                "transform itself; leave labels_getter out"
            )

    def soft_targets(self, targets: torch.Tensor) -> torch.Tensor:
        who = type(self).__name__
        if targets.dim() == 1:
            if self.num_classes is None:
                raise ValueError(f"{who}: num_classes must be passed if the labels are index-based (1D)")
            return one_hot(targets, self.num_classes)
        if targets.dim() == 2:
            if self.num_classes is not None and targets.shape[1] != self.num_classes:
                raise ValueError(
                    f"{who}: 2-D labels have {targets.shape[1]} columns but num_classes="
                    f"{self.num_classes}; leave num_classes out"
                )
            return targets.float()
        raise ValueError(
            f"{who}: labels must be class indices (N,) or probabilities (N, num_classes), "
            f"got shape {tuple(targets.shape)}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes})"


class MixUp(_TorchvisionMix):
    """torchvision's ``v2.MixUp``: blends each image with the previous one of the batch,
    λ ~ Beta(alpha, alpha) per batch; targets one-hot (or given as probabilities), mixed alike.

    Args:
        alpha: Beta parameter (> 0).
        num_classes: Classes of 1-D class-index labels (None: labels are N × C probabilities).
        labels_getter: Only "default": the Loader hands the targets over itself.
    """

    def draw(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> MixParams:
        lam = beta(self.alpha, (1,), generator)
        return MixParams(
            lam,
            torch.zeros(1, dtype=torch.bool, device=lam.device),
            torch.zeros(1, 4, dtype=torch.int64, device=lam.device),
        )


class CutMix(_TorchvisionMix):
    """torchvision's ``v2.CutMix``: pastes the previous image's pixels into one box per batch
    (λ ~ Beta(alpha, alpha), box half-sides ``int(0.5 · sqrt(1 - λ) · side)``), λ corrected
    to the clipped box's area; targets mixed with it.

    Args: as :class:`MixUp`.
    """

    def draw(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> MixParams:
        lam = beta(self.alpha, (1,), generator)
        cx, cy = integers(0, width, (1,), generator), integers(0, height, (1,), generator)
        r = 0.5 * torch.sqrt(1.0 - lam)
        half_w, half_h = (r * width).floor().long(), (r * height).floor().long()
        box = torch.stack(
            [
                (cy - half_h).clamp(min=0),
                (cy + half_h).clamp(max=height),
                (cx - half_w).clamp(min=0),
                (cx + half_w).clamp(max=width),
            ],
            dim=1,
        )
        return MixParams(box_lam(box, height, width), torch.ones(1, dtype=torch.bool, device=lam.device), box)


class RandomChoice(MixingTransform):
    """torchvision's ``v2.RandomChoice([MixUp(...), CutMix(...)], p)`` recipe: one of the
    given MixUp/CutMix transforms per batch, picked with probabilities ``p`` (default: equal).

    Every candidate's parameters are drawn (a few numbers) and the pick selects among them
    on the device, so the batch is mixed once and the host never waits.

    Args:
        transforms: :class:`MixUp` and :class:`CutMix` instances (other callables: compose
            them in the Loader's ``batch_transform`` list instead).
        p: Probabilities (normalized to sum 1), one per transform.

    Raises:
        TypeError: A transform that is not a fastload MixUp or CutMix.
        ValueError: ``p`` of the wrong length or with negative values.
    """

    partner = "roll"

    def __init__(self, transforms: Sequence[Any], p: Sequence[float] | None = None) -> None:
        transforms = list(transforms) if isinstance(transforms, Sequence) else transforms
        if not isinstance(transforms, list) or not transforms:
            raise ValueError(f"transforms must be a non-empty list of fl.augment.MixUp/CutMix, got {transforms!r}")
        for t in transforms:
            if not isinstance(t, _TorchvisionMix):
                raise TypeError(
                    f"fl.augment.RandomChoice picks among fl.augment.MixUp and CutMix; got "
                    f"{type(t).__name__}: put other batch transforms in Loader(batch_transform=[...])"
                )
        classes = {t.num_classes for t in transforms}
        if len(classes) > 1:
            raise ValueError(f"the transforms disagree on num_classes: {sorted(classes, key=str)}")
        p = [1.0] * len(transforms) if p is None else list(p)
        if len(p) != len(transforms):
            raise ValueError(f"Length of p doesn't match the number of transforms: {len(p)} != {len(transforms)}")
        p = [number(f"p[{i}]", v, 0.0) for i, v in enumerate(p)]
        if sum(p) <= 0:
            raise ValueError(f"p must have a positive sum, got {p!r}")
        self.transforms = transforms
        self.p = [v / sum(p) for v in p]

    def soft_targets(self, targets: torch.Tensor) -> torch.Tensor:
        return self.transforms[0].soft_targets(targets)

    def draw(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> MixParams:
        drawn = [t.draw(batch_size, height, width, generator) for t in self.transforms]
        # The pick counts the cumulative probabilities at or below u (Python numbers, not a
        # tensor copied to the device: the host would wait for that copy).
        u = uniform((1,), generator)
        edges = [sum(self.p[: i + 1]) for i in range(len(self.p) - 1)]
        pick = sum(((u >= edge).long() for edge in edges), torch.zeros_like(u, dtype=torch.long))
        lam, cutmix, box = (
            torch.stack([getattr(d, f) for d in drawn]).index_select(0, pick).squeeze(0)
            for f in ("lam", "cutmix", "box")
        )
        return MixParams(lam, cutmix, box)

    def __repr__(self) -> str:
        return f"RandomChoice({self.transforms!r}, p={self.p})"
