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

# With antialiasing, a crop is decoded at a DCT scale giving at least this many times
# its output size, so the antialiased filter does the last shrink by >= 2x: then the
# DCT's own filtering hardly shows (mean 0.4, worst 1.7 levels of 255 from a full
# decode on photos of 512-1500 px; 1.5 and 4.9 when decoding straight to output size).
REDUCE_GAP = 2.0


def _nchw(img: np.ndarray) -> torch.Tensor:
    # A channels-last view: the layout the uint8 kernel works in, so nothing is copied.
    return torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0)


def _out(dst: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if dst is None:
        return np.empty(shape, dtype=np.uint8)
    if dst.shape != shape or dst.dtype != np.uint8:
        raise ValueError(f"dst must be uint8 of shape {shape}, got {dst.dtype} {dst.shape}")
    return dst


def resize(img: np.ndarray, out_h: int, out_w: int, dst: np.ndarray | None = None,
           antialias: bool = True) -> np.ndarray:
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


def resize_window(img: np.ndarray, top: float, left: float, height: float, width: float, out_h: int,
                  out_w: int, dst: np.ndarray | None = None) -> np.ndarray:
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
    whole = _AA.default(_nchw(np.ascontiguousarray(img[:y1])), [ky + out_h, kx + out_w], False, sy, sx)
    window = whole[0, :, ky:, kx:].permute(1, 2, 0).numpy()
    if dst is None:
        return window  # a view: collate copies it once, into the batch
    _out(dst, (out_h, out_w, c))[...] = window
    return dst


def _decoded_scale(h: int, w: int, full_h: int, full_w: int) -> tuple[float, float]:
    # A DCT-scaled decode is ceil(side * s) pixels for s = 1/2, 1/4, 1/8, and its pixel
    # grid is the full one scaled by s exactly; the size ratio is off by up to half a
    # pixel at the far edge on odd sides (mean error 0.7 instead of 0.14 levels).
    for s in (1.0, 0.5, 0.25, 0.125):
        if h == math.ceil(full_h * s) and w == math.ceil(full_w * s):
            return s, s
    return h / full_h, w / full_w


@dataclass(frozen=True)
class Crop:
    """A crop box in full-resolution pixels and the size it is resized to.

    With ``window``, the box is a window of the whole image resized (torchvision's
    Resize then CenterCrop): its pixels are exactly those of the whole resize, filter
    taps outside the box included. Without, the box is cut out (rounded to whole pixels
    of the decoded image) and resized alone (torchvision's crop then resize).
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
        """The smallest decode scale for this crop's filter (REDUCE_GAP x min_scale when antialiased)."""
        return min(1.0, self.min_scale * REDUCE_GAP) if self.antialias else self.min_scale

    def apply(self, img: np.ndarray, full_h: int, full_w: int, dst: np.ndarray | None = None) -> np.ndarray:
        """Crops and resizes ``img``, a decode of a full_h × full_w image at any scale."""
        ry, rx = _decoded_scale(img.shape[0], img.shape[1], full_h, full_w)
        if self.window and self.antialias:
            return resize_window(img, self.top * ry, self.left * rx, self.height * ry, self.width * rx,
                                 self.out_h, self.out_w, dst)
        y0 = min(int(round(self.top * ry)), img.shape[0] - 1)
        x0 = min(int(round(self.left * rx)), img.shape[1] - 1)
        y1 = max(min(int(round((self.top + self.height) * ry)), img.shape[0]), y0 + 1)
        x1 = max(min(int(round((self.left + self.width) * rx)), img.shape[1]), x0 + 1)
        return resize(img[y0:y1, x0:x1], self.out_h, self.out_w, dst, self.antialias)
