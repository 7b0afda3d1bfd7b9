"""Colour operations on uint8 images, with torchvision.transforms.v2.functional's names,
parameters and pixels (its uint8-tensor kernels: float32 arithmetic, truncation to uint8).

Point operations are one OpenCV pass: a fused multiply-add where it reproduces the exact
256-entry table, else the table through cv2.LUT; the blends with a grayscale image are
one cv2.addWeighted. Inputs are H×W×C (C = 3, or 1 for grayscale) or H×W.
"""

from __future__ import annotations

import math
import threading

import cv2
import numpy as np

from ._utils import apply_lut, check_image, contiguous, like

_LEVELS = np.arange(256, dtype=np.float32)
_RAMP = np.arange(256, dtype=np.uint8).reshape(1, 256)
_GRAY_WEIGHTS = np.array([[0.2989, 0.587, 0.114]], dtype=np.float32)
# cv2 rounds to nearest; torchvision truncates. Shifting by just under half a level before
# OpenCV's rounding gives the truncation, but for values within 1e-4 below an integer
# (1e-4 is 3 float32 steps at 255: the shift survives the float sum). It was 1e-3, which
# sent 15-25% of random brightness/contrast factors to the slower cv2.LUT; 1e-4 sends ~1-2%.
_TRUNCATE = -0.5 + 1e-4
_SCRATCH = threading.local()
_SCRATCH_FLOATS = 1 << 20  # 4 MiB per thread: up to a 590×590 RGB image


def _factor(value: float, name: str) -> np.float32:
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value!r}")
    return np.float32(value)


def _scale_levels(img: np.ndarray, scale: np.float32, offset: np.float32) -> np.ndarray:
    """trunc(clamp(level * scale + offset)) per pixel, in torchvision's float32 order.

    The exact answer is a 256-entry table, but cv2.LUT is the slowest pass here (~37 µs per
    224×224 RGB image). OpenCV's fused multiply-adds round their own way, which differs
    where a value lands on an integer (with scale 0.1, many do), so a fused pass is run on
    the 256 levels first and used on the image only if it gives the table. With a
    non-negative offset no value is below zero and convertScaleAbs (one input, ~14 µs)
    serves; below zero its absolute value would be wrong, so addWeighted (~18 µs) does.
    """
    values = _LEVELS * scale
    values += offset
    table = np.minimum(np.maximum(values, 0, out=values), 255, out=values).astype(np.uint8)  # np.clip: slower
    src = contiguous(img)
    alpha, beta = float(scale), float(offset) + _TRUNCATE
    if offset >= 0:
        if cv2.norm(cv2.convertScaleAbs(_RAMP, alpha=alpha, beta=beta)[0], table, cv2.NORM_INF) == 0:
            return like(cv2.convertScaleAbs(src, alpha=alpha, beta=beta), img)
    elif cv2.norm(cv2.addWeighted(_RAMP, alpha, _RAMP, 0.0, beta)[0], table, cv2.NORM_INF) == 0:
        return like(cv2.addWeighted(src, alpha, src, 0.0, beta), img)
    return apply_lut(img, table)


def _float_scratch(img: np.ndarray) -> np.ndarray:
    """``img`` (C-contiguous) as float32, in this thread's scratch buffer: valid until the
    thread's next call, so callers reduce it and drop it.

    cv2.accumulateWeighted with weight 1 (dst = 0 * dst + src) converts in one SIMD pass,
    ~6 µs per 224×224 RGB image against ~14 µs for numpy's astype, into memory that is
    already mapped. The buffer's old contents are always finite (zeros or an earlier image),
    so 0 * dst is exactly 0. Images over _SCRATCH_FLOATS values get an array of their own
    rather than a buffer that large kept alive per thread.
    """
    n = img.size
    if n > _SCRATCH_FLOATS:
        return img.astype(np.float32)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None:
        buf = _SCRATCH.buf = np.zeros(_SCRATCH_FLOATS, np.float32)  # pages are touched as used
    out = buf[:n].reshape(img.shape)
    cv2.accumulateWeighted(img, out, 1.0)
    return out


def _gray_floor(img: np.ndarray) -> np.ndarray:
    """floor(0.2989 R + 0.587 G + 0.114 B) as uint8 H×W: torchvision's float32 grayscale,
    floored, before a blend (it matches torch's for all but 20 of the 256³ colours, by one).

    The sum is taken in float32 (no OpenCV integer path has these weights; cvtColor's are
    0.299, rounded); it lies in [0, 255), so the uint8 conversion's truncation is the floor.
    """
    if img.size == 0:
        return np.zeros(img.shape[:2], np.uint8)  # cv2.transform returns None for an empty image
    return cv2.transform(_float_scratch(contiguous(img)), _GRAY_WEIGHTS).astype(np.uint8)


def rgb_to_grayscale(inpt: np.ndarray, num_output_channels: int = 1) -> np.ndarray:
    """Luma (0.2989 R + 0.587 G + 0.114 B, truncated) as H×W×``num_output_channels`` (an H×W
    input with one output channel stays H×W).

    Args:
        inpt: H×W×3 RGB, or a grayscale image (copied or repeated as asked).
        num_output_channels: 1 or 3.
    """
    c = check_image(inpt, rgb_or_gray=True)
    if num_output_channels not in (1, 3):
        raise ValueError(f"num_output_channels must be 1 or 3, got {num_output_channels!r}")
    if c == 1:
        gray = inpt.reshape(inpt.shape[:2]).copy()
    else:
        gray = _gray_floor(inpt)
    if num_output_channels == 3:
        return cv2.cvtColor(gray, cv2.COLOR_GRAY2RGB)
    return gray[:, :, None] if inpt.ndim == 3 else gray


def adjust_brightness(inpt: np.ndarray, brightness_factor: float) -> np.ndarray:
    """Multiplies every level by ``brightness_factor`` (>= 0)."""
    check_image(inpt, rgb_or_gray=True)
    f = _factor(brightness_factor, "brightness_factor")
    return _scale_levels(inpt, f, np.float32(0.0))


def adjust_contrast(inpt: np.ndarray, contrast_factor: float) -> np.ndarray:
    """Blends with the mean of the (floored) grayscale image: 0 gives a flat gray image."""
    c = check_image(inpt, rgb_or_gray=True)
    f = _factor(contrast_factor, "contrast_factor")
    # The mean of integers: torch's float32 sum of them is exact (< 2^24), as is cv2's.
    mean = np.float32(cv2.mean(_gray_floor(inpt) if c == 3 else contiguous(inpt))[0])
    return _scale_levels(inpt, f, mean * np.float32(1.0 - float(f)))


def adjust_saturation(inpt: np.ndarray, saturation_factor: float) -> np.ndarray:
    """Blends with the grayscale image: 0 gives grayscale, 1 the original (1-channel: unchanged)."""
    c = check_image(inpt, rgb_or_gray=True)
    f = _factor(saturation_factor, "saturation_factor")
    if c == 1:
        return inpt
    gray = cv2.cvtColor(_gray_floor(inpt), cv2.COLOR_GRAY2RGB)
    return cv2.addWeighted(contiguous(inpt), float(f), gray, 1.0 - float(f), _TRUNCATE)


def adjust_hue(inpt: np.ndarray, hue_factor: float) -> np.ndarray:
    """Rotates the hue by ``hue_factor`` turns, in [-0.5, 0.5] (1-channel: unchanged)."""
    c = check_image(inpt, rgb_or_gray=True)
    if not -0.5 <= hue_factor <= 0.5:
        raise ValueError(f"hue_factor must be in [-0.5, 0.5], got {hue_factor!r}")
    if c == 1 or inpt.size == 0:
        return inpt
    hsv = cv2.cvtColor(contiguous(inpt).astype(np.float32) * np.float32(1 / 255), cv2.COLOR_RGB2HSV)
    hue = hsv[:, :, 0]
    np.add(hue, np.float32(hue_factor * 360.0), out=hue)
    np.mod(hue, np.float32(360.0), out=hue)
    rgb = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    # torchvision's float -> uint8: multiply by 256 - 1e-3, truncate.
    return (rgb * np.float32(255.999)).astype(np.uint8)


def adjust_sharpness(inpt: np.ndarray, sharpness_factor: float) -> np.ndarray:
    """Blends with a 3×3 smoothed image (1-pixel border unchanged): 0 smooths, 2 sharpens."""
    check_image(inpt, rgb_or_gray=True)
    f = float(_factor(sharpness_factor, "sharpness_factor"))
    h, w = inpt.shape[:2]
    if h <= 2 or w <= 2:
        return inpt
    src = contiguous(inpt)
    kernel = np.ones((3, 3), np.float32)
    kernel[1, 1] = 5.0
    blurred = cv2.filter2D(src, -1, kernel / 13.0, borderType=cv2.BORDER_REPLICATE)
    out = cv2.addWeighted(src, f, blurred, 1.0 - f, _TRUNCATE)
    out = like(out, inpt)
    out[0], out[-1], out[:, 0], out[:, -1] = src[0], src[-1], src[:, 0], src[:, -1]
    return out


def posterize(inpt: np.ndarray, bits: int) -> np.ndarray:
    """Keeps the ``bits`` (0-8) most significant bits of every level."""
    check_image(inpt)
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 0 <= bits <= 8:
        raise TypeError(f"bits must be an int in [0, 8], got {bits!r}")
    if bits == 8:
        return inpt
    mask = (0xFF << (8 - int(bits))) & 0xFF
    return like(cv2.bitwise_and(contiguous(inpt), np.full(inpt.shape, mask, np.uint8)), inpt)


def solarize(inpt: np.ndarray, threshold: float) -> np.ndarray:
    """Inverts every level >= ``threshold`` (at most 255)."""
    check_image(inpt)
    if threshold > 255:
        raise TypeError(f"threshold must be at most 255 for uint8 images, got {threshold!r}")
    src = contiguous(inpt)
    # 255 where level >= threshold (levels are ints: >= t is > ceil(t) - 1), then XOR:
    # 255 ^ x == 255 - x. torch compares with the threshold in float32: 170.000005 is 170.
    _, mask = cv2.threshold(src, math.ceil(float(np.float32(threshold))) - 1, 255, cv2.THRESH_BINARY)
    return like(cv2.bitwise_xor(src, mask), inpt)


def invert(inpt: np.ndarray) -> np.ndarray:
    """255 - every level."""
    check_image(inpt)
    return like(cv2.bitwise_not(contiguous(inpt)), inpt)


def _histograms(img: np.ndarray, c: int) -> np.ndarray:
    """(C, 256) int64 histograms of each channel."""
    src = contiguous(img)
    return np.stack([cv2.calcHist([src], [i], None, [256], [0, 256]).ravel() for i in range(c)]).astype(np.int64)


def autocontrast(inpt: np.ndarray) -> np.ndarray:
    """Stretches each channel's levels to span 0-255 (a flat channel is left as is)."""
    c = check_image(inpt, rgb_or_gray=True)
    if inpt.size == 0:
        return inpt
    src = contiguous(inpt)
    ranges = [cv2.minMaxLoc(plane)[:2] for plane in (cv2.split(src) if c > 1 else [src.reshape(src.shape[:2])])]
    if all(lo == 0 and hi == 255 for lo, hi in ranges) or all(lo == hi for lo, hi in ranges):
        return inpt  # already spanning 0-255 (common in photos), or flat: unchanged
    tables = np.empty((256, c), np.uint8)
    for i, (lo, hi) in enumerate(ranges):
        if hi == lo:
            tables[:, i] = np.arange(256)
            continue
        # torchvision's float32 order: (level - min) / ((max - min) / 255).
        inv_scale = np.float32(hi - lo) * np.float32(1.0 / 255)
        tables[:, i] = np.clip((_LEVELS - np.float32(lo)) / inv_scale, 0, 255).astype(np.uint8)
    return apply_lut(inpt, tables if c > 1 else tables[:, 0])


def equalize(inpt: np.ndarray) -> np.ndarray:
    """Equalizes each channel's histogram, with Pillow's table (ImageOps.equalize)."""
    c = check_image(inpt)
    if inpt.size == 0:
        return inpt
    tables = np.empty((256, c), np.uint8)
    levels = np.arange(256)
    for i, hist in enumerate(_histograms(inpt, c)):
        last = int(np.flatnonzero(hist)[-1])
        step = (int(hist.sum()) - int(hist[last])) // 255
        if step == 0:
            tables[:, i] = levels
            continue
        cum = np.cumsum(hist)
        tables[0, i] = 0
        tables[1:, i] = np.clip((cum[:-1] + step // 2) // step, 0, 255)
    return apply_lut(inpt, tables if c > 1 else tables[:, 0])
