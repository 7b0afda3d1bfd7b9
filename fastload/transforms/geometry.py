"""Random geometric transforms with torchvision v2's names, arguments and draws:
RandomCrop (with padding) and RandomVerticalFlip.

RandomCrop is not a crop planner: its padding makes pixels that no decode region holds,
so it runs on the decoded image. First in a pipeline, the image is decoded whole (as
for CIFAR-style 32×32 images, where that is all there is); after a crop planner (e.g.
RandomResizedCrop or Resize), it crops the planner's output.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from . import functional as F
from .crops import InPlace
from .functional._geometry import BORDERS, parse_padding
from .functional._utils import Fill, check_fill
from .settings import Settings


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    pair: tuple = ()
    if isinstance(size, (int, np.integer)):
        pair = (size, size)
    elif isinstance(size, (list, tuple)):
        pair = tuple(size)
    if len(pair) == 1:
        pair = (pair[0], pair[0])
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in pair):
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


class RandomCrop(Settings):
    """A ``size`` window at a uniformly drawn position, after optional padding.

    Args:
        size: Output (height, width), or one int for both.
        padding: Padding first added to every image: an int, [left/right, top/bottom] or
            [left, top, right, bottom].
        pad_if_needed: Pad an image smaller than ``size`` (by the shortfall on each side,
            as torchvision) instead of raising ValueError.
        fill: Constant padding's value (a number or one per channel).
        padding_mode: 'constant', 'edge', 'reflect' or 'symmetric'.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        padding: int | Sequence[int] | None = None,
        pad_if_needed: bool = False,
        fill: Fill = 0,
        padding_mode: str = "constant",
    ) -> None:
        self.size = _size(size)
        self.padding = parse_padding(padding) if padding is not None else (0, 0, 0, 0)  # left, top, right, bottom
        if padding_mode not in BORDERS:
            raise ValueError(f"padding_mode must be one of {sorted(BORDERS)}, got {padding_mode!r}")
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = check_fill(fill)
        self.padding_mode = padding_mode

    def params(self, h: int, w: int, rng: np.random.Generator) -> tuple[list[int], int, int]:
        """([left, top, right, bottom] padding, top, left) of the window for an h×w image."""
        left, top, right, bottom = self.padding
        ph, pw = h + top + bottom, w + left + right
        ch, cw = self.size
        if self.pad_if_needed:
            # torchvision pads both sides by the whole shortfall.
            if ph < ch:
                top, bottom, ph = top + ch - ph, bottom + ch - ph, ph + 2 * (ch - ph)
            if pw < cw:
                left, right, pw = left + cw - pw, right + cw - pw, pw + 2 * (cw - pw)
        if ph < ch or pw < cw:
            raise ValueError(
                f"RandomCrop{self.size} is larger than the {'padded ' if any(self.padding) else ''}"
                f"{ph}x{pw} image (pad_if_needed=True pads it)"
            )
        y = int(rng.integers(0, ph - ch + 1)) if ph > ch else 0
        x = int(rng.integers(0, pw - cw + 1)) if pw > cw else 0
        return [left, top, right, bottom], y, x

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        padding, y, x = self.params(img.shape[0], img.shape[1], rng)
        if any(padding):
            img = F.pad(img, padding, self.fill, self.padding_mode)
        ch, cw = self.size
        return img[y : y + ch, x : x + cw]

    def __repr__(self) -> str:
        return (
            f"RandomCrop(size={self.size}, padding={list(self.padding)}, pad_if_needed={self.pad_if_needed}, "
            f"fill={self.fill}, padding_mode={self.padding_mode!r})"
        )


class RandomVerticalFlip(InPlace):
    """Flips top-bottom with probability ``p`` (a view: no copy until collate)."""

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p = float(p)

    def draw(self, rng: np.random.Generator) -> bool:
        """Whether this sample is flipped: the one draw ``__call__`` makes."""
        return rng.random() < self.p

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return img[::-1] if self.draw(rng) else img

    def apply_inplace(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Same draw as ``__call__``, flipping ``img`` in place (for a batch slot)."""
        if self.draw(rng):
            cv2.flip(img, 0, dst=img)
        return img

    def __repr__(self) -> str:
        return f"RandomVerticalFlip(p={self.p})"
