"""The image operations of timm's auto-augment policies, with the pixels of the PIL calls timm makes.

timm's policies call Pillow (``ImageEnhance``, ``ImageOps``, ``Image.transform``); these are
the same operations on H×W×C uint8 arrays. Where torchvision's functional op gives
Pillow's pixels exactly (invert, solarize, posterize, equalize, brightness, sharpness) it
is called (:mod:`fastload.transforms.functional`); the others differ from torchvision's
by Pillow's integer arithmetic (contrast's rounded mean, Color's fixed-point grayscale,
autocontrast's truncated table) or geometry (timm shears about the corner), and are
here: 256-entry lookup tables, blends in float32 truncated as ``Image.blend`` does, and
one ``cv2.warpAffine`` whose matrix is Pillow's affine coefficients moved to OpenCV's
pixel-index convention. Point ops and enhancements give Pillow's pixels exactly; the
geometric ops differ by interpolation kernels (tests/test_timm_augment.py measures how much).
"""

from __future__ import annotations

import functools
import math

import cv2
import numpy as np

from . import functional as F

_I = np.arange(256, dtype=np.float32)
_IDENTITY = np.arange(256, dtype=np.uint8)
_CV_INTERP = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "nearest": cv2.INTER_NEAREST}


def _lut(img: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table`` (256 entries, or 256×C: one per channel) applied to ``img``."""
    table = np.asarray(table, dtype=np.uint8)
    if table.ndim == 1:
        return cv2.LUT(img, table).reshape(img.shape)
    return np.stack([cv2.LUT(img[..., c], table[c]) for c in range(img.shape[2])], axis=2)


def _blend_table(base: float, factor: float) -> np.ndarray:
    """Pillow's ``Image.blend(constant base, img, factor)`` as a table: float32, clipped, truncated."""
    return np.clip(np.float32(base) + np.float32(factor) * (_I - np.float32(base)), 0, 255).astype(np.uint8)


def _blend(degenerate: np.ndarray, img: np.ndarray, factor: float) -> np.ndarray:
    """Pillow's ``Image.blend(degenerate, img, factor)`` on uint8 arrays."""
    d = degenerate.astype(np.float32)
    out = d + np.float32(factor) * (img.astype(np.float32) - d)
    return np.clip(out, 0, 255, out=out).astype(np.uint8)


def grayscale(img: np.ndarray) -> np.ndarray:
    """Pillow's ``convert("L")`` (ITU-R 601-2 in 16-bit fixed point), H×W uint8."""
    if img.ndim == 2 or img.shape[2] == 1:
        return img.reshape(img.shape[:2])
    r, g, b = (img[..., c].astype(np.uint32) for c in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)


def _like(gray: np.ndarray, img: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], img.shape[2], axis=2) if img.ndim == 3 else gray


def brightness(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Brightness(img).enhance(factor)``."""
    return F.adjust_brightness(img, factor)


def contrast(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Contrast``: a blend towards the rounded mean of the grayscale image."""
    mean = int(float(grayscale(img).mean()) + 0.5)
    return _lut(img, _blend_table(mean, factor))


def color(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Color``: a blend towards the grayscale image (also timm's Desaturate)."""
    return _blend(_like(grayscale(img), img), img, factor)


def sharpness(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Sharpness``: a blend with Pillow's SMOOTH filter (the border left as is)."""
    return F.adjust_sharpness(img, factor)


def autocontrast(img: np.ndarray) -> np.ndarray:
    """``ImageOps.autocontrast(img)``: each channel stretched to [0, 255] (cutoff 0)."""
    tables = []
    for c in range(img.shape[2]):
        lo, hi = int(img[..., c].min()), int(img[..., c].max())
        if hi <= lo:
            tables.append(_IDENTITY)
            continue
        scale = 255.0 / (hi - lo)
        tables.append(np.clip((np.arange(256) * scale - lo * scale).astype(np.int64), 0, 255))
    return _lut(img, np.stack(tables))


def equalize(img: np.ndarray) -> np.ndarray:
    """``ImageOps.equalize(img)``: Pillow's per-channel histogram equalisation."""
    return F.equalize(img)


def invert(img: np.ndarray) -> np.ndarray:
    """``ImageOps.invert``."""
    return F.invert(img)


def solarize(img: np.ndarray, threshold: int) -> np.ndarray:
    """``ImageOps.solarize``: values >= ``threshold`` inverted (256: no change, as in timm)."""
    return img if threshold > 255 else F.solarize(img, threshold)


def solarize_add(img: np.ndarray, add: int, threshold: int = 128) -> np.ndarray:
    """timm's SolarizeAdd: ``add`` added (saturating) to values below ``threshold``."""
    table = np.where(np.arange(256) < threshold, np.minimum(255, np.arange(256) + add), np.arange(256))
    return _lut(img, table)


def posterize(img: np.ndarray, bits: int) -> np.ndarray:
    """``ImageOps.posterize``: keeps the ``bits`` high bits (8 or more: no change, as timm;
    0: black, what Pillow gave before it refused 0 and what timm's v0 policy expects)."""
    if bits >= 8:
        return img
    return F.posterize(img, bits)


def gaussian_blur(img: np.ndarray, radius: float) -> np.ndarray:
    """``ImageFilter.GaussianBlur(radius)``, as a true gaussian of sigma ``radius`` (Pillow
    approximates it with three box blurs: close, not equal)."""
    if radius <= 0:
        return img
    return cv2.GaussianBlur(img, (0, 0), radius, borderType=cv2.BORDER_REPLICATE).reshape(img.shape)


@functools.lru_cache(maxsize=8)
def _zeros(h: int, w: int) -> np.ndarray:
    return np.zeros((h, w), np.uint8)


@functools.lru_cache(maxsize=8)
def _fill_image(h: int, w: int, fill: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(np.asarray(fill, np.uint8), (h, w, len(fill))).copy()


def pil_affine(img: np.ndarray, coeffs: tuple[float, ...], interpolation: str, fill: tuple[int, ...]) -> np.ndarray:
    """``img.transform(size, Image.AFFINE, coeffs, resample, fillcolor=fill)``.

    Pillow maps an output point (x, y) to the input point (a x + b y + c, d x + e y + f) in
    coordinates whose pixel centres sit at +0.5; an output pixel whose input point falls
    outside the image is ``fill`` (there is no blend with the fill at the edge: the border
    is replicated), which the warp of a mask below reproduces.
    """
    a, b, c, d, e, f = coeffs
    h, w = img.shape[:2]
    # Pixel-index coordinates: x_in = a (x + .5) + b (y + .5) + c - .5.
    m = np.array([[a, b, c + 0.5 * (a + b - 1)], [d, e, f + 0.5 * (d + e - 1)]], dtype=np.float64)
    flags = _CV_INTERP[interpolation] | cv2.WARP_INVERSE_MAP
    out = cv2.warpAffine(img, m, (w, h), flags=flags, borderMode=cv2.BORDER_REPLICATE).reshape(img.shape)
    # Outside iff the input point, rounded to a pixel, is not one: nearest sampling of a
    # mask of zeros whose border is 1; then the fill copied there (cv2's masked copy: a
    # boolean-indexed numpy assignment cost 3x the warp's mask).
    outside = cv2.warpAffine(
        _zeros(h, w),
        m,
        (w, h),
        flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=1,
    )
    cv2.copyTo(_fill_image(h, w, tuple(fill[: img.shape[2]])), outside, out)
    return out


def shear_x(img: np.ndarray, factor: float, interpolation: str, fill: tuple[int, ...]) -> np.ndarray:
    """timm's ShearX: the input column x + factor·y (a shear about the top-left corner)."""
    return pil_affine(img, (1, factor, 0, 0, 1, 0), interpolation, fill)


def shear_y(img: np.ndarray, factor: float, interpolation: str, fill: tuple[int, ...]) -> np.ndarray:
    """timm's ShearY."""
    return pil_affine(img, (1, 0, 0, factor, 1, 0), interpolation, fill)


def translate_x(img: np.ndarray, pixels: float, interpolation: str, fill: tuple[int, ...]) -> np.ndarray:
    """timm's TranslateX: the content moves left by ``pixels``."""
    return pil_affine(img, (1, 0, pixels, 0, 1, 0), interpolation, fill)


def translate_y(img: np.ndarray, pixels: float, interpolation: str, fill: tuple[int, ...]) -> np.ndarray:
    """timm's TranslateY: the content moves up by ``pixels``."""
    return pil_affine(img, (1, 0, 0, 0, 1, pixels), interpolation, fill)


def rotate(img: np.ndarray, degrees: float, interpolation: str, fill: tuple[int, ...]) -> np.ndarray:
    """``img.rotate(degrees)``: counter-clockwise about the centre, same size."""
    h, w = img.shape[:2]
    cx, cy = w / 2.0, h / 2.0
    angle = -math.radians(degrees)
    a, b, d, e = (
        round(math.cos(angle), 15),
        round(math.sin(angle), 15),
        round(-math.sin(angle), 15),
        round(math.cos(angle), 15),
    )
    c = a * -cx + b * -cy + cx
    f = d * -cx + e * -cy + cy
    return pil_affine(img, (a, b, c, d, e, f), interpolation, fill)
