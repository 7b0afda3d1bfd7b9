"""torchvision's transforms that apply one operation, with probability ``p`` or always:
RandomInvert, RandomPosterize, RandomEqualize, RandomAutocontrast, RandomAdjustSharpness,
Grayscale and Pad (same names and arguments; the operation is :mod:`.functional`'s)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import functional as F
from .color import _probability
from .functional._utils import finite
from .settings import Settings

_PROBE = np.zeros((2, 2, 3), np.uint8)  # arguments are checked by the operation itself, once


class _MaybeApplied(Settings):
    """Applies ``op`` with probability ``p`` (one draw from the sample's rng)."""

    def __init__(self, op: Callable[[np.ndarray], np.ndarray], p: float, name: str, args: str = "") -> None:
        self._op, self.p, self._name, self._args = op, _probability(p), name, args
        op(_PROBE)  # a bad argument is a ValueError/TypeError naming it, here and not in a worker

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self._op(img) if rng.random() < self.p else img

    def __repr__(self) -> str:
        return f"{self._name}({self._args}{', ' if self._args else ''}p={self.p})"


class RandomInvert(_MaybeApplied):
    """Inverts the image (255 - level) with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(F.invert, p, "RandomInvert")


class RandomPosterize(_MaybeApplied):
    """Keeps the ``bits`` high bits of each level with probability ``p``."""

    def __init__(self, bits: int, p: float = 0.5) -> None:
        self.bits = bits
        super().__init__(lambda img: F.posterize(img, bits), p, "RandomPosterize", f"bits={bits}")


class RandomEqualize(_MaybeApplied):
    """Equalizes the histogram of each channel with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(F.equalize, p, "RandomEqualize")


class RandomAutocontrast(_MaybeApplied):
    """Stretches each channel to the full range with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(F.autocontrast, p, "RandomAutocontrast")


class RandomAdjustSharpness(_MaybeApplied):
    """Adjusts the sharpness by ``sharpness_factor`` with probability ``p``."""

    def __init__(self, sharpness_factor: float, p: float = 0.5) -> None:
        self.sharpness_factor = finite("sharpness_factor", sharpness_factor)
        super().__init__(
            lambda img: F.adjust_sharpness(img, sharpness_factor),
            p,
            "RandomAdjustSharpness",
            f"sharpness_factor={sharpness_factor}",
        )


class Grayscale(Settings):
    """The grayscale image, with 1 or 3 channels (torchvision's weights and rounding)."""

    def __init__(self, num_output_channels: int = 1) -> None:
        if num_output_channels not in (1, 3):
            raise ValueError(f"num_output_channels must be 1 or 3, got {num_output_channels!r}")
        self.num_output_channels = num_output_channels

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        return F.rgb_to_grayscale(img, self.num_output_channels)

    def __repr__(self) -> str:
        return f"Grayscale(num_output_channels={self.num_output_channels})"


class Pad(Settings):
    """Pads the image: ``padding`` as torchvision's (one value, (left/right, top/bottom) or
    (left, top, right, bottom)), ``fill`` for 'constant', or 'edge', 'reflect', 'symmetric'."""

    def __init__(self, padding: int | Sequence[int], fill: Any = 0, padding_mode: str = "constant") -> None:
        self.padding, self.fill, self.padding_mode = padding, fill, padding_mode
        self(_PROBE)  # a bad argument is a ValueError naming it, here and not in a worker

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        return F.pad(img, self.padding, self.fill, self.padding_mode)

    def __repr__(self) -> str:
        return f"Pad(padding={self.padding}, fill={self.fill}, padding_mode={self.padding_mode!r})"
