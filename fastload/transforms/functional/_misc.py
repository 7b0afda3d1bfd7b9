"""Filtering operations: torchvision.transforms.v2.functional.gaussian_blur on uint8 arrays."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from ._utils import check_image, contiguous, like


def _kernel1d(size: int, sigma: float) -> np.ndarray:
    # torchvision's taps: exp(-(i - centre)^2 / (2 sigma^2)), normalized (a softmax in float32).
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2
    k = np.exp(-(x * x) / (2.0 * sigma * sigma))
    return (k / k.sum()).astype(np.float32)


def gaussian_blur(
    inpt: np.ndarray, kernel_size: int | Sequence[int], sigma: float | Sequence[float] | None = None
) -> np.ndarray:
    """Separable Gaussian blur with reflected borders (torchvision's 'reflect': edge not repeated).

    Args:
        inpt: uint8 H×W×C or H×W.
        kernel_size: Odd positive (kx, ky), or one int for both.
        sigma: (sx, sy) or one float for both; None: ``0.3 * ((k - 1) * 0.5 - 1) + 0.8``,
            torchvision's ``k * 0.15 + 0.35``.
    """
    check_image(inpt)
    ks = [kernel_size, kernel_size] if isinstance(kernel_size, (int, np.integer)) else list(kernel_size)
    if len(ks) != 2 or not all(isinstance(k, (int, np.integer)) and k > 0 and k % 2 == 1 for k in ks):
        raise ValueError(f"kernel_size must be odd positive ints (kx, ky), got {kernel_size!r}")
    if sigma is None:
        sig = [k * 0.15 + 0.35 for k in ks]
    elif isinstance(sigma, (int, float, np.integer, np.floating)):
        sig = [float(sigma)] * 2
    elif isinstance(sigma, (list, tuple)) and len(sigma) in (1, 2):
        sig = [float(sigma[0]), float(sigma[-1])]
    else:
        raise TypeError(f"sigma must be a float or (sx, sy), got {sigma!r}")
    if min(sig) <= 0:
        raise ValueError(f"sigma must be positive, got {sigma!r}")
    if inpt.size == 0:
        return inpt
    kx, ky = _kernel1d(int(ks[0]), sig[0]), _kernel1d(int(ks[1]), sig[1])
    out = cv2.sepFilter2D(contiguous(inpt), -1, kx, ky, borderType=cv2.BORDER_REFLECT_101)
    return like(out, inpt)
