"""The pixels and targets of Mixup and CutMix, given their drawn parameters.

Every mixing recipe (timm's per batch, pair or element; torchvision's MixUp and CutMix)
blends each image with a partner image of the same batch: the one at the mirrored
position (``flip``, timm) or the one before it (``roll``, torchvision). A MixUp sample
keeps weight ``lam`` of itself; a CutMix sample takes its partner's pixels inside a box
and keeps weight ``lam = 1 - box area / image area`` in its target. Both are one
``lerp`` over the batch with a per-pixel weight, so a batch is mixed in one pass
whatever mixes each of its samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PARTNERS = ("flip", "roll")


@dataclass(frozen=True)
class MixParams:
    """What mixes each sample (one row for the whole batch, or one per sample).

    Attributes:
        lam: float64: the weight the sample keeps of its own target (for a CutMix sample,
            of its own pixels: 1 - box area / image area); 1.0 leaves it unmixed.
        cutmix: bool: True where the partner's pixels are pasted in ``box`` rather than blended.
        box: int64 (y0, y1, x0, x1) per row, half-open; meaningful where ``cutmix``.
    """

    lam: torch.Tensor
    cutmix: torch.Tensor
    box: torch.Tensor

    def to(self, device: torch.device) -> MixParams:
        return MixParams(self.lam.to(device), self.cutmix.to(device), self.box.to(device))

    def mirrored(self, n: int) -> MixParams:
        """Per-pair rows (``n // 2`` of them) as per-sample rows: sample ``n-1-i`` mixes as
        sample ``i`` does; the middle one of an odd batch is paired with itself (unchanged)."""
        half = self.lam.shape[0]
        pad = n - 2 * half

        def spread(t: torch.Tensor, fill: float | bool | int) -> torch.Tensor:
            middle = torch.full((pad,) + t.shape[1:], fill, dtype=t.dtype, device=t.device)
            return torch.cat([t, middle, t.flip(0)])

        return MixParams(spread(self.lam, 1.0), spread(self.cutmix, False), spread(self.box, 0))


def partner_of(t: torch.Tensor, partner: str) -> torch.Tensor:
    """Each row's partner row: the mirrored one (``flip``) or the previous one (``roll``)."""
    return t.flip(0) if partner == "flip" else t.roll(1, 0)


def inside(box: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """bool rows × H × W: which pixels each row's (y0, y1, x0, x1) box holds."""
    ys = torch.arange(height, device=box.device).view(1, height, 1)
    xs = torch.arange(width, device=box.device).view(1, 1, width)
    y0, y1, x0, x1 = (box[:, k].view(-1, 1, 1) for k in range(4))
    return (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)


def box_lam(box: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """1 - box area / image area, float64 (the CutMix λ corrected to the clipped box)."""
    area = (box[:, 1] - box[:, 0]) * (box[:, 3] - box[:, 2])
    return 1.0 - area.to(torch.float64) / float(height * width)


def mix_images(images: torch.Tensor, params: MixParams, partner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixed batch, and the λ each sample's target must keep (float32, one per row).

    The image weight is ``lam`` in the images' dtype; a MixUp row's target λ is that same
    rounded value, so a float16/bfloat16 batch and its targets agree exactly. CutMix rows
    copy pixels (weights 0 and 1 are exact in any dtype).
    """
    if not images.is_floating_point():
        raise TypeError(f"mixing needs a floating-point batch (normalize=True), got {images.dtype}")
    height, width = images.shape[-2:]
    lam_px = params.lam.to(images.dtype)
    cut = params.cutmix.view(-1, 1, 1)
    keep = ~inside(params.box, height, width) & cut  # CutMix rows: 1 outside the box, 0 inside
    weight = torch.where(cut, keep.to(images.dtype), lam_px.view(-1, 1, 1)).unsqueeze(1)
    # lerp is exact at weights 0 and 1: unmixed pixels keep their value bit for bit.
    mixed = torch.lerp(partner_of(images, partner), images, weight)
    target_lam = torch.where(params.cutmix, params.lam, lam_px.to(torch.float64)).to(torch.float32)
    return mixed, target_lam.expand(images.shape[0]) if target_lam.shape[0] == 1 else target_lam


def one_hot(targets: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """float32 N × num_classes: ``1 - smoothing + smoothing / num_classes`` at each class
    index and ``smoothing / num_classes`` elsewhere (timm's smoothed one-hot)."""
    if targets.dtype in (torch.bool,) or targets.is_floating_point() or targets.is_complex():
        raise TypeError(f"class-index targets must be an integer tensor, got {targets.dtype}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= num_classes) \
            and targets.device.type == "cpu":  # checked where it costs no device sync
        raise ValueError(f"targets must be class indices in [0, {num_classes}), got values in "
                         f"[{int(targets.min())}, {int(targets.max())}]")
    off = smoothing / num_classes
    out = torch.full((targets.shape[0], num_classes), off, dtype=torch.float32, device=targets.device)
    return out.scatter_(1, targets.long().view(-1, 1), 1.0 - smoothing + off)


def mix_targets(soft: torch.Tensor, lam: torch.Tensor, partner: str) -> torch.Tensor:
    """``lam · soft + (1 - lam) · partner's soft``, float32 N × C."""
    lam = lam.to(soft.device, torch.float32).view(-1, 1)
    return soft * lam + partner_of(soft, partner) * (1.0 - lam)
