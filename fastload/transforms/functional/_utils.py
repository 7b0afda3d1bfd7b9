"""Checks and conversions shared by the functional operations."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

# Pillow's integer constants, which torchvision accepts for ``interpolation``.
_PIL_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic", 1: "lanczos", 4: "box", 5: "hamming"}
_CV2_MODES = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR}

Fill = float | Sequence[float] | None


def finite(name: str, value: Any) -> Any:
    """``value`` as given when it, or each number of a sequence, is finite; else a ValueError
    naming ``name``. inf and nan pass most range checks (``v >= 0``, ``lo <= hi``) and then
    fail every sample in a worker: transforms check their numbers with this at construction."""
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def check_image(img: Any, rgb_or_gray: bool = False) -> int:
    """The channel count of a uint8 H×W or H×W×C array (TypeError otherwise).

    Args:
        img: The image.
        rgb_or_gray: Only 1 or 3 channels are allowed (the colour operations).
    """
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim not in (2, 3):
        what = f"{img.dtype} array of shape {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__
        raise TypeError(f"expected a uint8 H×W×C or H×W numpy array, got a {what}")
    c = 1 if img.ndim == 2 else img.shape[2]
    if rgb_or_gray and c not in (1, 3):
        raise TypeError(f"expected 1 or 3 channels, got an image of shape {img.shape}")
    return c


def like(out: np.ndarray, img: np.ndarray) -> np.ndarray:
    """``out`` with ``img``'s layout: OpenCV drops the trailing axis of H×W×1 images."""
    return out[:, :, None] if img.ndim == 3 and out.ndim == 2 else out


def contiguous(img: np.ndarray) -> np.ndarray:
    """A C-contiguous array OpenCV can take (flips and crops are views)."""
    return img if img.flags.c_contiguous else np.ascontiguousarray(img)


def apply_lut(img: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[img]`` through cv2.LUT: ``table`` is (256,) for all channels or (256, C)."""
    table = np.ascontiguousarray(table, dtype=np.uint8)
    lut = table.reshape(1, 256, -1) if table.ndim == 2 else table
    return like(cv2.LUT(contiguous(img), lut), img)


def interpolation_name(interpolation: Any) -> str:
    """'nearest' or 'bilinear' from a string, a torchvision InterpolationMode or a Pillow constant."""
    name = getattr(interpolation, "value", interpolation)
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        name = _PIL_MODES.get(int(name), name)
    if name not in _CV2_MODES:
        raise ValueError(
            f"interpolation must be 'nearest' or 'bilinear' (or torchvision's InterpolationMode "
            f"of those), got {interpolation!r}"
        )
    return name


def cv2_interpolation(interpolation: Any) -> int:
    """The OpenCV flag for ``interpolation`` (see :func:`interpolation_name`)."""
    return _CV2_MODES[interpolation_name(interpolation)]


def fill_values(fill: Fill, channels: int) -> list[float]:
    """``fill`` (None, a number or one per channel) as one float per channel."""
    if fill is None:
        return [0.0] * channels
    finite("fill", fill)
    if isinstance(fill, (int, float, np.integer, np.floating)) and not isinstance(fill, bool):
        return [float(fill)] * channels
    if isinstance(fill, (list, tuple)) and all(isinstance(v, (int, float, np.integer, np.floating)) for v in fill):
        if len(fill) == 1:
            return [float(fill[0])] * channels
        if len(fill) == channels:
            return [float(v) for v in fill]
        raise ValueError(f"fill {fill!r} has {len(fill)} values for an image of {channels} channels")
    raise TypeError(f"fill must be None, a number or a sequence of numbers, got {fill!r}")


def check_fill(fill: Fill) -> float | list[float] | None:
    """``fill`` checked once, at a transform's construction: None, a number, or numbers."""
    if fill is None:
        return None
    finite("fill", fill)
    if isinstance(fill, (int, float, np.integer, np.floating)) and not isinstance(fill, bool):
        return float(fill)
    if (
        isinstance(fill, (list, tuple))
        and fill
        and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in fill)
    ):
        return [float(v) for v in fill]
    raise TypeError(f"fill must be None, a number or a sequence of numbers, got {fill!r}")
