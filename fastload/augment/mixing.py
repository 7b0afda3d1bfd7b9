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

from collections.abc import Sequence
from dataclasses import dataclass

import torch


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
        """On ``device`` (a no-op where they were drawn; non_blocking: the host never waits)."""
        return MixParams(*(t.to(device, non_blocking=True) for t in (self.lam, self.cutmix, self.box)))

    def mirrored(self, n: int) -> MixParams:
        """Per-pair rows (``n // 2`` of them) as per-sample rows: sample ``n-1-i`` mixes as
        sample ``i`` does; the middle one of an odd batch is paired with itself (unchanged)."""
        half = self.lam.shape[0]
        pad = n - 2 * half

        def spread(t: torch.Tensor, fill: float) -> torch.Tensor:
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


def on_host(t: torch.Tensor) -> bool:
    """Whether ``t`` is in host memory, where reading a few parameters costs nothing and
    per-box slices (touching only the pixels that change) beat full-batch masks. On a
    device the masks run instead: reading parameters there would make the host wait."""
    return t.device.type == "cpu"


def mix_images(images: torch.Tensor, params: MixParams, partner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixes ``images`` in place; returns them and the λ each sample's target keeps (float32 N).

    A MixUp row moves towards its partner by ``1 - lam`` rounded to the images' dtype, and
    its target keeps ``1 -`` that same rounded value, so a float16/bfloat16 batch and its
    targets agree exactly. CutMix rows copy pixels (weights 0 and 1 are exact in any dtype).
    """
    if not images.is_floating_point():
        raise TypeError(f"mixing needs a floating-point batch (normalize=True), got {images.dtype}")
    height, width = images.shape[-2:]
    towards = (1.0 - params.lam).to(images.dtype)  # the partner's weight in a MixUp row
    cut = params.cutmix.view(-1, 1, 1)
    others = partner_of(images, partner)  # a copy: images is rewritten below
    if on_host(images):
        # lerp_ is exact at weight 0: CutMix rows keep their pixels, then get the box pasted.
        images.lerp_(others, torch.where(cut, 0.0, towards.view(-1, 1, 1)).to(images.dtype).unsqueeze(1))
        rows: Sequence[int | slice] = range(images.shape[0]) if params.lam.shape[0] > 1 else [slice(None)]
        for row, pasted, (y0, y1, x0, x1) in zip(rows, params.cutmix.tolist(), params.box.tolist()):
            if pasted:
                images[row, ..., y0:y1, x0:x1] = others[row, ..., y0:y1, x0:x1]
    else:
        pasted = inside(params.box, height, width) & cut  # CutMix rows: 1 inside the box, 0 outside
        # lerp_ is exact at weights 0 and 1: unmixed pixels keep their value bit for bit.
        images.lerp_(others, torch.where(cut, pasted.to(images.dtype), towards.view(-1, 1, 1)).unsqueeze(1))
    target_lam = torch.where(params.cutmix, params.lam, 1.0 - towards.to(torch.float64)).to(torch.float32)
    return images, target_lam.expand(images.shape[0]) if target_lam.shape[0] == 1 else target_lam


def one_hot(targets: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """float32 N × num_classes: ``1 - smoothing + smoothing / num_classes`` at each class
    index and ``smoothing / num_classes`` elsewhere (timm's smoothed one-hot)."""
    if targets.dtype in (torch.bool,) or targets.is_floating_point() or targets.is_complex():
        raise TypeError(f"class-index targets must be an integer tensor, got {targets.dtype}")
    if (
        targets.numel()
        and (int(targets.min()) < 0 or int(targets.max()) >= num_classes)
        and targets.device.type == "cpu"
    ):  # checked where it costs no device sync
        raise ValueError(
            f"targets must be class indices in [0, {num_classes}), got values in "
            f"[{int(targets.min())}, {int(targets.max())}]"
        )
    off = smoothing / num_classes
    out = torch.full((targets.shape[0], num_classes), off, dtype=torch.float32, device=targets.device)
    return out.scatter_(1, targets.long().view(-1, 1), 1.0 - smoothing + off)


def mix_targets(soft: torch.Tensor, lam: torch.Tensor, partner: str) -> torch.Tensor:
    """``lam · soft + (1 - lam) · partner's soft``, float32 N × C."""
    lam = lam.to(soft.device, torch.float32).view(-1, 1)
    return soft * lam + partner_of(soft, partner) * (1.0 - lam)
