"""The train and eval pipelines of ImageNet-style training."""

from __future__ import annotations

from collections.abc import Sequence

from .compose import Compose
from .crops import RandomHorizontalFlip, RandomResizedCrop, ResizedCenterCrop, _pair

def train(size: int = 224, scale: Sequence[float] = (0.08, 1.0), flip: bool = True,
          reduced_decode: bool = True, antialias: bool = True) -> Compose:
    """RandomResizedCrop(size, scale) and a random horizontal flip (antialiased unless
    ``antialias=False``, the faster OpenCV bilinear)."""
    ts: list = [RandomResizedCrop(size, scale=scale, antialias=antialias)]
    if flip:
        ts.append(RandomHorizontalFlip())
    return Compose(ts, reduced_decode)


def eval(size: int = 224, resize: int | None = None, reduced_decode: bool = True,  # noqa: A001
         antialias: bool = True) -> Compose:
    """Resize the shorter side to ``resize`` (default size / 0.875), then centre-crop ``size``.

    Antialiased, it matches torchvision's Resize + CenterCrop on PIL images to within
    rounding; ``antialias=False`` is the faster OpenCV bilinear.
    """
    size_hw = _pair(size, "size")
    crop = ResizedCenterCrop(size_hw, resize or int(round(max(size_hw) / 0.875)), antialias)
    return Compose([crop], reduced_decode)
