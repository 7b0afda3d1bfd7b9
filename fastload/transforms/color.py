"""Random photometric transforms with torchvision v2's names, arguments and draws:
ColorJitter, RandomGrayscale, RandomSolarize, GaussianBlur. Each is ``t(img, rng)`` on a
uint8 H×W×C (or grayscale) image and draws only from ``rng``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import functional as F
from .functional._utils import finite
from .settings import Settings


def _probability(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not 0 <= p <= 1:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    return float(p)


def _jitter_range(
    value: float | Sequence[float] | None,
    name: str,
    center: float = 1.0,
    bound: tuple[float, float] = (0.0, float("inf")),
    clip_first_on_zero: bool = True,
) -> tuple[float, float] | None:
    """torchvision's ColorJitter._check_input: a number v means [center - v, center + v]."""
    if value is None:
        return None
    finite(name, value)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be non-negative when a single number, got {value!r}")
        lo, hi = center - float(value), center + float(value)
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise TypeError(f"{name} must be a number or a (min, max) pair, got {value!r}")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"{name} must give {bound[0]} <= min <= max <= {bound[1]}, got {value!r}")
    return None if lo == hi == center else (lo, hi)


class ColorJitter(Settings):
    """Brightness, contrast, saturation and hue adjusted in a random order, each by a
    factor drawn uniformly from its range (None: left alone).

    Args:
        brightness: v for [max(0, 1 - v), 1 + v], or (min, max).
        contrast: v for [max(0, 1 - v), 1 + v], or (min, max).
        saturation: v for [max(0, 1 - v), 1 + v], or (min, max).
        hue: v in [0, 0.5] for [-v, v], or (min, max) within [-0.5, 0.5].
    """

    def __init__(
        self,
        brightness: float | Sequence[float] | None = None,
        contrast: float | Sequence[float] | None = None,
        saturation: float | Sequence[float] | None = None,
        hue: float | Sequence[float] | None = None,
    ) -> None:
        self.brightness = _jitter_range(brightness, "brightness")
        self.contrast = _jitter_range(contrast, "contrast")
        self.saturation = _jitter_range(saturation, "saturation")
        self.hue = _jitter_range(hue, "hue", center=0.0, bound=(-0.5, 0.5), clip_first_on_zero=False)
        self._ops = [
            (F.adjust_brightness, self.brightness),
            (F.adjust_contrast, self.contrast),
            (F.adjust_saturation, self.saturation),
            (F.adjust_hue, self.hue),
        ]

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        order = rng.permutation(4).tolist()
        factors = [None if r is None else float(rng.uniform(r[0], r[1])) for _, r in self._ops]
        for i in order:
            if factors[i] is not None:
                img = self._ops[i][0](img, factors[i])
        return img

    def __repr__(self) -> str:
        return (
            f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue})"
        )


class RandomGrayscale(Settings):
    """Grayscale with probability ``p``, keeping the channel count (3 stays 3)."""

    def __init__(self, p: float = 0.1) -> None:
        self.p = _probability(p)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if not rng.random() < self.p:
            return img
        channels = 1 if img.ndim == 2 else img.shape[2]
        return F.rgb_to_grayscale(img, num_output_channels=channels)

    def __repr__(self) -> str:
        return f"RandomGrayscale(p={self.p})"


class RandomSolarize(Settings):
    """Inverts the levels >= ``threshold`` with probability ``p``."""

    def __init__(self, threshold: float, p: float = 0.5) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
            raise TypeError(f"threshold must be a number, got {threshold!r}")
        finite("threshold", threshold)
        if threshold > 255:
            raise ValueError(f"threshold must be at most 255 for uint8 images, got {threshold!r}")
        self.threshold = float(threshold)
        self.p = _probability(p)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return F.solarize(img, self.threshold) if rng.random() < self.p else img

    def __repr__(self) -> str:
        return f"RandomSolarize(threshold={self.threshold}, p={self.p})"


class GaussianBlur(Settings):
    """Gaussian blur with sigma drawn uniformly from ``sigma`` (min, max), or fixed.

    Args:
        kernel_size: Odd positive int, or (kx, ky).
        sigma: A fixed sigma, or (min, max) with 0 < min <= max.
    """

    def __init__(self, kernel_size: int | Sequence[int], sigma: float | Sequence[float] = (0.1, 2.0)) -> None:
        if isinstance(kernel_size, (int, np.integer)):
            ks: tuple = (kernel_size, kernel_size)
        elif isinstance(kernel_size, (list, tuple)):
            ks = tuple(kernel_size)
        else:
            ks = ()  # refused below, naming kernel_size
        if len(ks) != 2 or not all(isinstance(k, (int, np.integer)) and k > 0 and k % 2 == 1 for k in ks):
            raise ValueError(f"kernel_size must be an odd positive int or two of them, got {kernel_size!r}")
        if isinstance(sigma, (int, float, np.integer, np.floating)) and not isinstance(sigma, bool):
            lo = hi = float(sigma)
        elif isinstance(sigma, (list, tuple)) and len(sigma) in (1, 2):
            lo, hi = float(sigma[0]), float(sigma[-1])
        else:
            raise TypeError(f"sigma must be a number or (min, max), got {sigma!r}")
        finite("sigma", (lo, hi))
        if not 0 < lo <= hi:
            raise ValueError(f"sigma must be positive, as (min, max) with min <= max, got {sigma!r}")
        self.kernel_size = (int(ks[0]), int(ks[1]))
        self.sigma = (lo, hi)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        s = float(rng.uniform(self.sigma[0], self.sigma[1]))
        return F.gaussian_blur(img, list(self.kernel_size), [s, s])

    def __repr__(self) -> str:
        return f"GaussianBlur(kernel_size={self.kernel_size}, sigma={self.sigma})"
