"""Geometric operations on uint8 images, with torchvision.transforms.v2.functional's names,
parameters and pixels: flips, crop, pad, rotate, affine.

rotate and affine warp with OpenCV from the inverse matrix torchvision builds
(``_get_inverse_affine_matrix``), moved from torchvision's centred, normalized grid to
OpenCV's pixel coordinates, so each output pixel samples the same source point.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, cast

import cv2
import numpy as np

from ._utils import Fill, check_image, contiguous, cv2_interpolation, fill_values, like

BORDERS = {
    "constant": cv2.BORDER_CONSTANT,
    "edge": cv2.BORDER_REPLICATE,
    "reflect": cv2.BORDER_REFLECT_101,
    "symmetric": cv2.BORDER_REFLECT,
}


def horizontal_flip(inpt: np.ndarray) -> np.ndarray:
    """Left-right mirror (a view)."""
    check_image(inpt)
    return inpt[:, ::-1]


def vertical_flip(inpt: np.ndarray) -> np.ndarray:
    """Top-bottom mirror (a view)."""
    check_image(inpt)
    return inpt[::-1]


hflip = horizontal_flip
vflip = vertical_flip


def parse_padding(padding: Any) -> tuple[int, int, int, int]:
    """torchvision's ``padding`` (int, [all], [left/right, top/bottom], [left, top, right, bottom])
    as (left, top, right, bottom)."""
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        p = [int(padding)] * 4
    elif isinstance(padding, (list, tuple)) and all(isinstance(v, (int, np.integer)) for v in padding):
        if len(padding) == 1:
            p = [int(padding[0])] * 4
        elif len(padding) == 2:
            p = [int(padding[0]), int(padding[1])] * 2
        elif len(padding) == 4:
            p = [int(v) for v in padding]
        else:
            raise ValueError(f"padding must be an int or 1, 2 or 4 ints, got {padding!r}")
    else:
        raise TypeError(f"padding must be an int or a sequence of ints, got {padding!r}")
    if min(p) < 0:
        raise ValueError(f"padding must be non-negative, got {padding!r}")
    return p[0], p[1], p[2], p[3]


def pad(
    inpt: np.ndarray, padding: int | Sequence[int], fill: Fill = None, padding_mode: str = "constant"
) -> np.ndarray:
    """Pads the borders.

    Args:
        inpt: uint8 H×W×C or H×W.
        padding: int, or [left/right, top/bottom], or [left, top, right, bottom].
        fill: Constant mode's value (a number or one per channel; truncated to uint8 as
            torchvision does).
        padding_mode: 'constant', 'edge', 'reflect' (edge not repeated) or 'symmetric'.
    """
    c = check_image(inpt)
    if padding_mode not in BORDERS:
        raise ValueError(f"padding_mode must be one of {sorted(BORDERS)}, got {padding_mode!r}")
    left, top, right, bottom = parse_padding(padding)
    per_channel = fill is not None and not isinstance(fill, numbers.Number) and len(cast(Sequence[float], fill)) > 1
    if padding_mode != "constant" and per_channel:
        raise ValueError(f"padding_mode {padding_mode!r} takes no per-channel fill, got {fill!r}")
    value = [float(int(min(max(v, 0), 255))) for v in fill_values(fill, c)]
    out = cv2.copyMakeBorder(contiguous(inpt), top, bottom, left, right, BORDERS[padding_mode], value=value)
    return like(out, inpt)


def crop(inpt: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    """The (top, left, height, width) window; parts outside the image are zeros."""
    check_image(inpt)
    h, w = inpt.shape[:2]
    bottom, right = top + height, left + width
    if top >= 0 and left >= 0 and bottom <= h and right <= w:
        return inpt[top:bottom, left:right]
    inside = inpt[max(top, 0) : max(bottom, 0), max(left, 0) : max(right, 0)]
    pads = [
        max(min(right, 0) - left, 0),
        max(min(bottom, 0) - top, 0),
        max(right - max(w, left), 0),
        max(bottom - max(h, top), 0),
    ]
    return pad(inside, pads)


def _inverse_matrix(
    center: Sequence[float], angle: float, translate: Sequence[float], scale: float, shear: Sequence[float]
) -> list[float]:
    """torchvision's inverse of T * C * Rotate*Scale*Shear * C^-1, in coordinates centred on
    the image (6 numbers, row-major 2×3)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


def _warp(img: np.ndarray, m: list[float], out_w: int, out_h: int, interpolation: Any, fill: Fill) -> np.ndarray:
    """Samples ``img`` at ``m`` applied to each output pixel's centred coordinates.

    torchvision maps output pixel x to the centred point x - (out_w - 1) / 2, applies ``m``
    and reads the input at that point + (w - 1) / 2 (grid_sample, align_corners=False);
    OpenCV's inverse map takes the same affine function of the pixel indices.
    """
    c = check_image(img)
    flag = cv2_interpolation(interpolation)
    h, w = img.shape[:2]
    ox, oy, ix, iy = (out_w - 1) * 0.5, (out_h - 1) * 0.5, (w - 1) * 0.5, (h - 1) * 0.5
    inverse = np.array(
        [[m[0], m[1], m[2] + ix - m[0] * ox - m[1] * oy], [m[3], m[4], m[5] + iy - m[3] * ox - m[4] * oy]],
        dtype=np.float64,
    )
    value = fill_values(fill, c)
    if flag == cv2.INTER_NEAREST and _axis_aligned(m):
        taken = _take_on_ties(img, m, out_w, out_h, value)
        if taken is not None:
            return taken
    src, size, flags = contiguous(img), (out_w, out_h), flag | cv2.WARP_INVERSE_MAP
    if fill is None or flag == cv2.INTER_NEAREST:
        # torchvision rounds the (float) fill into the uint8 result, as OpenCV does.
        out = cv2.warpAffine(
            src, inverse, size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=value if c <= 4 else value[:4]
        )
        return like(out, img)
    # Bilinear with a fill: torchvision samples the image with zeros outside and a mask of
    # ones alike, then takes image * mask + fill * (1 - mask), so its edge pixels are
    # darker than a constant border's; do the same.
    sampled = cv2.warpAffine(src, inverse, size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    mask = cv2.warpAffine(
        np.ones((h, w), np.float32), inverse, size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0
    )
    sampled = sampled.reshape(out_h, out_w, c).astype(np.float32)
    mask = mask[:, :, None]
    out = sampled * mask + np.array(value, np.float32) * (1 - mask)
    return np.rint(out).clip(0, 255).astype(np.uint8).reshape((out_h, out_w) + img.shape[2:])


def _axis_aligned(m: list[float]) -> bool:
    """Whether the 2×2 part is a signed permutation (a multiple of 90 degrees, no scale or shear)."""
    part = [round(v, 12) for v in (m[0], m[1], m[3], m[4])]
    return all(v in (-1.0, 0.0, 1.0) for v in part) and sum(v != 0 for v in part) == 2


def _torch_coords(n_out: int, n_in: int, scale: float, offset: float) -> np.ndarray:
    """Source pixel coordinates as torchvision computes them in float32 for one axis: the
    centred output coordinate times ``scale`` plus ``offset`` (centred), normalized by half
    the input size, then unnormalized by grid_sample (align_corners=False)."""
    half = np.float32(0.5 * n_in)
    base = np.linspace((1.0 - n_out) * 0.5, (n_out - 1.0) * 0.5, n_out, dtype=np.float32)
    grid = base * (np.float32(scale) / half) + np.float32(offset) / half
    return ((grid + np.float32(1)) * np.float32(n_in) - np.float32(1)) / np.float32(2)


def _take_on_ties(img: np.ndarray, m: list[float], out_w: int, out_h: int, value: list[float]) -> np.ndarray | None:
    """Nearest sampling for a signed permutation whose sample points fall half-way between
    pixels (a 90-degree turn of a W×H image with W - H odd, a half-pixel shift), else None.

    There torchvision rounds half to even, after its float32 arithmetic: its coordinates
    are redone here per axis and the pixels taken by index. Elsewhere (integer shifts,
    square turns) OpenCV's warp gives the same pixels, faster.
    """
    h, w = img.shape[:2]
    if round(m[0], 12) != 0:  # output x reads source x, output y source y
        src = img
        cols = _torch_coords(out_w, w, round(m[0]), m[2])
        rows = _torch_coords(out_h, h, round(m[4]), m[5])
    else:  # output x reads source y, output y source x: index the transposed image
        src = img.swapaxes(0, 1)
        rows = _torch_coords(out_h, w, round(m[1]), m[2])
        cols = _torch_coords(out_w, h, round(m[3]), m[5])
    if not any(np.any(np.abs(v - np.floor(v) - 0.5) < 1e-3) for v in (rows, cols)):
        return None
    rows, cols = np.rint(rows).astype(np.int64), np.rint(cols).astype(np.int64)
    ok_rows, ok_cols = (rows >= 0) & (rows < src.shape[0]), (cols >= 0) & (cols < src.shape[1])
    out = np.take(np.take(src, np.clip(rows, 0, src.shape[0] - 1), axis=0), np.clip(cols, 0, src.shape[1] - 1), axis=1)
    out = np.ascontiguousarray(out)
    inside = ok_rows[:, None] & ok_cols[None, :]
    if not inside.all():
        fill = np.array([min(max(int(np.rint(v)), 0), 255) for v in value], np.uint8)
        out[~inside] = fill if out.ndim == 3 else fill[0]
    return out


def _centre_offset(center: Sequence[float] | None, w: int, h: int) -> list[float]:
    if center is None:
        return [0.0, 0.0]
    if not isinstance(center, (list, tuple)) or len(center) != 2:
        raise TypeError(f"center must be (x, y) or None, got {center!r}")
    return [float(center[0]) - w * 0.5, float(center[1]) - h * 0.5]


def affine(
    inpt: np.ndarray,
    angle: float,
    translate: Sequence[float],
    scale: float,
    shear: float | Sequence[float],
    interpolation: Any = "nearest",
    fill: Fill = None,
    center: Sequence[float] | None = None,
) -> np.ndarray:
    """Rotation, translation, scale and shear about ``center``, as torchvision's affine.

    Args:
        inpt: uint8 H×W×C or H×W.
        angle: Rotation in degrees, clockwise (torchvision's convention for affine).
        translate: (tx, ty) in pixels.
        scale: Positive scale.
        shear: One angle (x) or (x, y) in degrees.
        interpolation: 'nearest' (default) or 'bilinear' (or torchvision's InterpolationMode).
        fill: Value of the pixels from outside the image (a number or one per channel).
        center: (x, y) in pixels; None: the image centre.
    """
    if not isinstance(angle, (int, float, np.integer, np.floating)):
        raise TypeError(f"angle must be a number, got {angle!r}")
    if not isinstance(translate, (list, tuple)) or len(translate) != 2:
        raise TypeError(f"translate must be (tx, ty), got {translate!r}")
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    if isinstance(shear, (int, float, np.integer, np.floating)):
        shear = [float(shear), 0.0]
    elif isinstance(shear, (list, tuple)) and len(shear) in (1, 2):
        shear = [float(shear[0]), float(shear[-1])]
    else:
        raise TypeError(f"shear must be a number or (sx, sy), got {shear!r}")
    check_image(inpt)
    h, w = inpt.shape[:2]
    m = _inverse_matrix(_centre_offset(center, w, h), float(angle), [float(t) for t in translate], float(scale), shear)
    return _warp(inpt, m, w, h, interpolation, fill)


def _expanded_size(m: list[float], w: int, h: int) -> tuple[int, int]:
    """torchvision's output size for ``expand=True``: the rotated corners' bounding box."""
    hw, hh = 0.5 * w, 0.5 * h
    pts = np.array([[-hw, -hh, 1.0], [-hw, hh, 1.0], [hw, hh, 1.0], [hw, -hh, 1.0]], np.float32)
    new = pts @ np.array(m, np.float32).reshape(2, 3).T
    lo, hi = new.min(0) + np.array([hw, hh], np.float32), new.max(0) + np.array([hw, hh], np.float32)
    # Truncated to 1e-4 first, as torchvision, so 1e-15 above an integer does not ceil.
    hi = np.ceil(np.trunc(hi * 1e4) * 1e-4)
    lo = np.floor(np.trunc(lo * 1e4) * 1e-4)
    size = hi - lo
    return int(size[0]), int(size[1])


def rotate(
    inpt: np.ndarray,
    angle: float,
    interpolation: Any = "nearest",
    expand: bool = False,
    center: Sequence[float] | None = None,
    fill: Fill = None,
) -> np.ndarray:
    """Rotates by ``angle`` degrees counter-clockwise.

    Args:
        inpt: uint8 H×W×C or H×W.
        angle: Degrees, counter-clockwise.
        interpolation: 'nearest' (default) or 'bilinear' (or torchvision's InterpolationMode).
        expand: Grow the output to hold the whole rotated image.
        center: (x, y) in pixels; None: the image centre.
        fill: Value of the pixels from outside the image (a number or one per channel).
    """
    check_image(inpt)
    cv2_interpolation(interpolation)  # validated even where the fast paths below need none
    angle = float(angle) % 360
    h, w = inpt.shape[:2]
    if center is None:  # torchvision's exact transposes
        if angle == 0:
            return inpt.copy()
        if angle == 180:
            return inpt[::-1, ::-1].copy()
        if (expand or h == w) and angle in (90, 270):
            return np.ascontiguousarray(np.rot90(inpt, 1 if angle == 90 else 3, axes=(0, 1)))
    m = _inverse_matrix(_centre_offset(center, w, h), -angle, [0.0, 0.0], 1.0, [0.0, 0.0])
    out_w, out_h = _expanded_size(m, w, h) if expand else (w, h)
    return _warp(inpt, m, out_w, out_h, interpolation, fill)
