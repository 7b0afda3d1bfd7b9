"""Resizing uint8 HWC images: antialiased bilinear as torchvision v2 and Pillow, or OpenCV's.

The antialiased filter is PyTorch's uint8 kernel behind
``interpolate(mode="bilinear", antialias=True)``: Pillow's triangle filter widened by
the shrink factor, vectorised, the one torchvision v2 runs. It is called through its
ATen op because ``interpolate`` cannot take an explicit output size *and* scale (needed
to resize a window of an image exactly as the whole image would be) nor write into a
given array. The GIL is released while it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np
import torch

_AA = torch.ops.aten._upsample_bilinear2d_aa

# For decoders the planner does not cost (OpenCV, Pillow: power-of-2 scales only), an
# antialiased crop is decoded at a DCT scale giving at least this many times its output
# size. TurboJPEG decodes are planned by fastload.decode.plan (MIN_RATIO there).
REDUCE_GAP = 2.0


def _nchw(img: np.ndarray) -> torch.Tensor:
    # A channels-last view: the layout the uint8 kernel works in, so nothing is copied.
    # Except for a read-only array (np.asarray of a PIL image, in a user's Dataset): torch
    # warns that its tensor could write to it, so the kernel reads a copy.
    if not img.flags.writeable:
        img = img.copy()
    return torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0)


def _out(dst: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if dst is None:
        return np.empty(shape, dtype=np.uint8)
    if dst.shape != shape or dst.dtype != np.uint8:
        raise ValueError(f"dst must be uint8 of shape {shape}, got {dst.dtype} {dst.shape}")
    return dst


def resize(
    img: np.ndarray, out_h: int, out_w: int, dst: np.ndarray | None = None, antialias: bool = True
) -> np.ndarray:
    """Resizes ``img`` (H×W×C uint8) to ``out_h`` × ``out_w``, into ``dst`` when given.

    Args:
        img: The image.
        out_h: Output rows.
        out_w: Output columns.
        dst: Array of the output's shape to write into (returned).
        antialias: Antialiased bilinear (Pillow's and torchvision v2's filter). False:
            OpenCV's bilinear, or its area filter when shrinking more than 2x (faster,
            aliases between 1x and 2x).
    """
    h, w, c = img.shape
    if (h, w) == (out_h, out_w):
        if dst is None:
            return img
        dst[...] = img
        return dst
    out = _out(dst, (out_h, out_w, c))
    if not antialias:
        interp = cv2.INTER_AREA if h > 2 * out_h or w > 2 * out_w else cv2.INTER_LINEAR
        cv2.resize(img, (out_w, out_h), dst=out, interpolation=interp)
        return out
    # A strided crop is copied here: numpy copies faster than the kernel's own fallback.
    _AA.out(_nchw(np.ascontiguousarray(img)), [out_h, out_w], False, None, None, out=_nchw(out))
    return out


def resize_window(
    img: np.ndarray,
    top: float,
    left: float,
    height: float,
    width: float,
    out_h: int,
    out_w: int,
    dst: np.ndarray | None = None,
) -> np.ndarray:
    """The window (top, left, height, width) of ``img`` resized to ``out_h`` × ``out_w``, with
    the antialiased filter, pixel for pixel as resizing the whole image by the same factors
    and cropping (Pillow's ``resize(box=...)``): filter taps reach outside the window.

    The window must start on a whole output pixel of that whole-image resize, as a
    centre crop of a resized image does; other windows are rounded to whole input pixels
    and resized alone (taps stop at their edges, as in crop-then-resize).
    """
    sy, sx = out_h / height, out_w / width  # output pixels per input pixel
    ky, kx = top * sy, left * sx  # the window's first output pixel in the whole-image resize
    if abs(ky - round(ky)) > 1e-6 or abs(kx - round(kx)) > 1e-6:
        y0, x0 = int(round(top)), int(round(left))
        y1, x1 = max(int(round(top + height)), y0 + 1), max(int(round(left + width)), x0 + 1)
        return resize(img[y0:y1, x0:x1], out_h, out_w, dst)
    ky, kx = int(round(ky)), int(round(kx))
    h, w, c = img.shape
    # The kernel's horizontal pass runs over every input row, so rows below the last
    # taps are cut off (still a contiguous slice); columns right of them are never read.
    y1 = min(h, math.ceil((ky + out_h) / sy + max(1.0, 1.0 / sy)) + 1)
    # Output rows and columns are computed from 0: the ky rows above and kx columns left
    # of the window are computed and dropped, the price of exact phase (~20% on a centre crop).
    return _resize_dropping(np.ascontiguousarray(img[:y1]), ky, kx, out_h, out_w, sy, sx, dst)


def _resize_dropping(
    img: np.ndarray, ky: int, kx: int, out_h: int, out_w: int, sy: float, sx: float, dst: np.ndarray | None
) -> np.ndarray:
    """The antialiased resize of ``img`` by ``sy`` x ``sx`` output pixels per input pixel to
    ``ky + out_h`` x ``kx + out_w``, less its first ``ky`` rows and ``kx`` columns.

    Written into an H×W×C array through the kernel's ``out=`` (channels-last, as the kernel
    computes): its plain call returns a contiguous N×C×H×W tensor, which costs a layout
    conversion there and a planar-to-interleaved copy here (~1.5x the resize itself).
    """
    c = img.shape[2]
    if ky == 0 and kx == 0 and dst is not None:
        _AA.out(_nchw(img), [out_h, out_w], False, sy, sx, out=_nchw(_out(dst, (out_h, out_w, c))))
        return dst
    whole = np.empty((ky + out_h, kx + out_w, c), np.uint8)
    _AA.out(_nchw(img), [ky + out_h, kx + out_w], False, sy, sx, out=_nchw(whole))
    window = whole[ky:, kx:]
    if dst is None:
        return window  # a view: collate copies it once, into the batch
    _out(dst, (out_h, out_w, c))[...] = window
    return dst


def _phase(start: float, step: float) -> tuple[int, int, float]:
    """(k, m, err): output m of a resize of the rows from k on, by ``step`` input pixels per
    output pixel, is centred ``err`` pixels from where the window's first output belongs.

    The kernel centres output j at (j + 0.5) * step from its first input row, so a window
    starting between pixels is reached by starting at a whole row k (negative: edge rows
    repeated above) and dropping the first m outputs: k + m * step == start. The smallest
    m within PHASE_TOL is taken; for some steps there is none (a step of exactly 2 keeps
    a start of x.5 at x.5 forever), and then the nearest is returned.
    """
    best = (round(start), 0, abs(start - round(start)))
    for m in range(1, MAX_PHASE + 1):
        if best[2] <= PHASE_TOL:
            break
        k = math.floor(start - m * step + 0.5)
        err = abs(start - m * step - k)
        if err < best[2] - 1e-12:
            best = (k, m, err)
    return best


def phase_error(start: float, step: float) -> float:
    """How far (in input pixels) :func:`resize_box` misplaces a window starting at ``start``."""
    return _phase(start, step)[2]


MAX_PHASE = 16  # at most this many extra output rows (columns) computed and dropped
PHASE_TOL = 1 / 16  # input pixels: a shift too small to show (0.1 levels of 255 on photos)


def _padded(img: np.ndarray, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    """``img[y0:y1, x0:x1]`` as a contiguous array, negative y0, x0 repeating the edge."""
    if y0 >= 0 and x0 >= 0:
        return np.ascontiguousarray(img[y0:y1, x0:x1])
    py, px = max(0, -y0), max(0, -x0)
    out = np.empty((y1 - y0, x1 - x0, img.shape[2]), np.uint8)
    out[py:, px:] = img[max(0, y0) : y1, max(0, x0) : x1]
    out[:py, px:] = out[py : py + 1, px:]
    out[:, :px] = out[:, px : px + 1]
    return out


def resize_box(
    img: np.ndarray,
    top: float,
    left: float,
    height: float,
    width: float,
    out_h: int,
    out_w: int,
    dst: np.ndarray | None = None,
) -> np.ndarray:
    """The box (top, left, height, width), in pixels of ``img`` and not necessarily whole
    ones, resized to ``out_h`` × ``out_w`` with the antialiased filter: Pillow's
    ``resize(box=...)`` to within :data:`PHASE_TOL` (see :func:`phase_error`), taps past
    the box's near edges included, not past its far edges.

    For a crop of a DCT-scaled decode, whose whole full-size pixels start between
    decoded pixels: rounding them to whole decoded pixels instead shifts the picture by
    up to half a decoded pixel (mean 1.4 levels of 255 on photos at scale 1/2, against
    0.45 with the exact phase).
    """
    h, w, c = img.shape
    sy, sx = height / out_h, width / out_w  # input pixels per output pixel
    (ky, my, y1), (kx, mx, x1) = _box_span(top, height, out_h, h), _box_span(left, width, out_w, w)
    return _resize_dropping(_padded(img, ky, y1, kx, x1), my, mx, out_h, out_w, 1 / sy, 1 / sx, dst)


def _box_span(start: float, length: float, out: int, size: int) -> tuple[int, int, int]:
    """(k, m, end) of :func:`resize_box` along one axis of ``size`` pixels: it reads pixels
    k (edge-repeated below 0) to end, and drops its first m outputs."""
    k, m, _ = _phase(start, length / out)
    return k, m, min(size, max(math.ceil(start + length - 1e-9), k + 1))


def _cut(start: float, length: float, size: int) -> tuple[int, int]:
    """The whole pixels [a, b) of a crop (starting at ``start``, ``length`` long) of ``size`` pixels."""
    a = min(int(round(start)), size - 1)
    return a, max(min(int(round(start + length)), size), a + 1)


def _decoded_scale(h: int, w: int, full_h: int, full_w: int) -> tuple[float, float]:
    # A DCT-scaled decode is ceil(side * s) pixels for s = n/8, and its pixel grid is
    # the full one scaled by s exactly; the size ratio is off by up to half a pixel at
    # the far edge on odd sides (mean error 0.7 instead of 0.14 levels).
    for n in (8, 4, 2, 1, 7, 6, 5, 3):
        s = n / 8
        if h == math.ceil(full_h * s) and w == math.ceil(full_w * s):
            return s, s
    return h / full_h, w / full_w


@dataclass(frozen=True)
class Crop:
    """A crop box in full-resolution pixels and the size it is resized to.

    With ``window``, the box is a window of the whole image resized (torchvision's
    Resize then CenterCrop): its pixels are exactly those of the whole resize, filter
    taps outside the box included. Without, the box is cut out (whole pixels, as
    torchvision's crop) and resized alone (torchvision's crop then resize).
    """

    top: float
    left: float
    height: float
    width: float
    out_h: int
    out_w: int
    antialias: bool = True
    window: bool = False

    @property
    def min_scale(self) -> float:
        """The smallest decode scale whose crop still has out_h × out_w pixels."""
        return max(self.out_h / self.height, self.out_w / self.width)

    @property
    def decode_scale(self) -> float:
        """The smallest decode scale for this crop's filter (REDUCE_GAP x min_scale when antialiased),
        for decoders the planner does not cost (OpenCV, Pillow)."""
        return min(1.0, self.min_scale * REDUCE_GAP) if self.antialias else self.min_scale

    def apply(
        self,
        img: np.ndarray,
        full_h: int,
        full_w: int,
        dst: np.ndarray | None = None,
        scale: float | None = None,
        origin: tuple[int, int] = (0, 0),
    ) -> np.ndarray:
        """Crops and resizes ``img``, a decode of a full_h × full_w image.

        Args:
            img: The decoded pixels.
            full_h: Rows of the full-size image.
            full_w: Columns of the full-size image.
            dst: Array of the output's shape to write into (returned).
            scale: The DCT scale ``img`` was decoded at; None infers it from its size (1 for a region).
            origin: Where ``img`` starts in the full-size image (a region decode; scale 1).
        """
        if scale is None and origin == (0, 0):
            ry, rx = _decoded_scale(img.shape[0], img.shape[1], full_h, full_w)
        elif scale is None:
            ry = rx = 1.0
        else:
            ry = rx = scale
        top, left = (self.top - origin[0]) * ry, (self.left - origin[1]) * rx
        if self.window and self.antialias:
            return resize_window(img, top, left, self.height * ry, self.width * rx, self.out_h, self.out_w, dst)
        if self.antialias and (ry != 1 or rx != 1):
            return resize_box(img, top, left, self.height * ry, self.width * rx, self.out_h, self.out_w, dst)
        (y0, y1), (x0, x1) = _cut(top, self.height * ry, img.shape[0]), _cut(left, self.width * rx, img.shape[1])
        return resize(img[y0:y1, x0:x1], self.out_h, self.out_w, dst, self.antialias)

    def reads(self, h: int, w: int, scale: float) -> tuple[int, int, int]:
        """(top, left, right): the first row and the columns [left, right) of an h x w decode
        at DCT ``scale`` that :meth:`apply` reads (no window: those read from row 0), so a
        region decode of them, to the bottom, serves it (:func:`fastload.decode.plan.execute`)."""
        top, left = self.top * scale, self.left * scale
        if self.antialias and scale != 1:
            (ky, _, _), (kx, _, x1) = (
                _box_span(top, self.height * scale, self.out_h, h),
                _box_span(left, self.width * scale, self.out_w, w),
            )
            return max(0, ky), max(0, kx), x1
        (y0, _), (x0, x1) = _cut(top, self.height * scale, h), _cut(left, self.width * scale, w)
        return y0, x0, x1


# The crop geometry of torchvision's RandomResizedCrop and Resize + CenterCrop, here beside
# Crop: the transforms' crop planners draw with it, and so does the decoder's cost
# calibration (fastload.decode.costs), which sits below the transforms.


def shorter_side(h: int, w: int, size: int) -> tuple[int, int]:
    """(height, width) after torchvision's ``Resize(size)``: the shorter side to ``size``, the
    longer one truncated."""
    if h <= w:
        return size, max(1, int(size * w / h))
    return max(1, int(size * h / w)), size


def random_resized_crop(
    h: int,
    w: int,
    out: tuple[int, int],
    scale: tuple[float, float],
    ratio: tuple[float, float],
    rng: np.random.Generator,
    antialias: bool = True,
) -> Crop:
    """torchvision's RandomResizedCrop box of an h×w image, resized to ``out``: 10 tries at a
    random area (``scale``) and log-uniform aspect ratio (``ratio``), then a centre crop
    clamped to ``ratio``."""
    area = h * w
    (s0, s1), (r0, r1) = scale, (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        # One draw of 4 uniforms per try (area, ratio, top, left): numpy's per-call
        # overhead made 4 separate draws ~3x slower, a few % of a sample's time.
        u_area, u_ratio, u_top, u_left = rng.random(4).tolist()
        target = area * (s0 + (s1 - s0) * u_area)
        aspect = math.exp(r0 + (r1 - r0) * u_ratio)
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            top = int(u_top * (h - ch + 1))
            left = int(u_left * (w - cw + 1))
            return Crop(top, left, ch, cw, *out, antialias)
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        ch, cw = h, w
    return Crop((h - ch) // 2, (w - cw) // 2, ch, cw, *out, antialias)


def resized_center_crop(h: int, w: int, size: tuple[int, int], resize: int, antialias: bool = True) -> Crop:
    """``Resize(resize)`` then ``CenterCrop(size)`` of an h×w image as one window of it."""
    rh, rw = shorter_side(h, w, resize)
    sy, sx = h / rh, w / rw
    ch, cw = size
    top, left = int(round((rh - ch) / 2)), int(round((rw - cw) / 2))
    return Crop(top * sy, left * sx, ch * sy, cw * sx, ch, cw, antialias, window=True)
