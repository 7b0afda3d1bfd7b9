"""Decoded images → batch rows, in one step: each row's box cut, resized (antialiased
bilinear), windowed, flipped and rounded into the uint8 batch.

:func:`resize_rows` takes the decoded H×W×3 uint8 images (any sizes, each in its own
memory, as nvImageCodec hands them over) and a table row per image: its box, the size the
box is resized to, the window of that size kept, the flip and the batch row it fills.
Three ways compute it:

- ``"triton"``: one Triton kernel launch for the whole batch (:mod:`.rowkernel`), the math
  of PyTorch's CUDA ``interpolate(mode="bilinear", antialias=True)`` in float32, rounded
  half to even as ``torch.round``. It reads each image in place by its address, so the
  images need no gathering first. On CPU tensors it runs in Triton's interpreter (tests).
- ``"float"``: the same, as a loop of ``F.interpolate`` calls in float32 per row: the
  reference, and the CUDA path where Triton is missing.
- ``"uint8"``: a loop of ``F.interpolate`` on uint8, the CPU path's kernel (its own
  rounding; within a level of the float math): what the CPU stand-in of GPU decode runs,
  so its pixels equal the CPU path's.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["METHODS", "kernel", "method_for", "resize_rows", "row_table", "triton_available"]

#: The ways :func:`resize_rows` computes (``"auto"`` picks one by device).
METHODS = ("auto", "float", "triton", "uint8")

# Output pixels per kernel program (a power of 2): on CUDA, 256 keeps a program's loads
# coalesced along an output line and the grid at a few hundred programs per 224x224 row; the
# interpreter runs each program's ops in numpy, so fewer, larger programs run faster there.
BLOCK = 256
BLOCK_INTERPRETED = 4096


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports (the kernel of ``method="triton"``)."""
    try:
        kernel(interpret=False)
    except ImportError:
        return False
    return True


def kernel(interpret: bool) -> Any:
    """The Triton row kernel: compiled (CUDA tensors) or Triton's interpreter (CPU tensors).

    Raises:
        ImportError: Triton is missing (names the pip command).
    """
    try:
        rowkernel = importlib.import_module(f"{__package__}.rowkernel")
    except ImportError as e:
        raise ImportError(f"GPU decode's row kernel needs Triton: pip install triton ({e})") from e
    return rowkernel.interpreted if interpret else rowkernel.compiled


def method_for(device: torch.device) -> str:
    """What ``method="auto"`` runs on ``device``: the kernel on CUDA (the reference loop
    without Triton), the CPU path's uint8 kernel on the CPU."""
    if device.type == "cpu":
        return "uint8"
    return "triton" if triton_available() else "float"


def row_table(
    images: Sequence[torch.Tensor],
    boxes: np.ndarray,
    resize: np.ndarray,
    windows: np.ndarray,
    flips: np.ndarray,
    dest: np.ndarray,
    out_size: tuple[int, int],
) -> torch.Tensor:
    """The kernel's int64 R×10 table (:data:`.rowkernel.COLUMNS`), on the host.

    Each row: the address of its box's top-left pixel, the bytes between image lines, the
    box's height and width, the resize, the window's top and left, the flip and the batch
    row. Images must be H×W×3 uint8 with pixels and channels packed (lines may be apart:
    a region's view of a whole image is fine).

    Raises:
        ValueError: Tables of different lengths, an image that is not H×W×3 uint8 packed
            so, a box outside its image, or a window outside its resize.
    """
    n = len(images)
    if not all(len(t) == n for t in (boxes, resize, windows, flips, dest)):
        raise ValueError(
            f"one table row per image: {n} images, {len(boxes)} boxes, {len(resize)} resizes, "
            f"{len(windows)} windows, {len(flips)} flips, {len(dest)} rows"
        )
    out_h, out_w = out_size
    table = np.empty((n, 10), dtype=np.int64)
    for r, img in enumerate(images):
        if img.dtype != torch.uint8 or img.dim() != 3 or img.shape[2] != 3 or img.stride()[1:] != (3, 1):
            raise ValueError(
                f"image {r}: H×W×3 uint8 with packed pixels, got {img.dtype} {tuple(img.shape)} strides {img.stride()}"
            )
        y0, x0, y1, x1 = (int(v) for v in boxes[r])
        rh, rw = (int(v) for v in resize[r])
        top, left = (int(v) for v in windows[r])
        if not (0 <= y0 < y1 <= img.shape[0] and 0 <= x0 < x1 <= img.shape[1]):
            raise ValueError(f"row {r}: box {(y0, x0, y1, x1)} is not inside its {tuple(img.shape[:2])} image")
        if not (0 <= top and top + out_h <= rh and 0 <= left and left + out_w <= rw):
            raise ValueError(f"row {r}: a {out_size} window at {(top, left)} is not inside the resize {(rh, rw)}")
        pitch = img.stride(0)  # in bytes: uint8
        start = img.data_ptr() + y0 * pitch + x0 * 3
        table[r] = (start, pitch, y1 - y0, x1 - x0, rh, rw, top, left, int(bool(flips[r])), int(dest[r]))
    return torch.from_numpy(table)


def resize_rows(
    out: torch.Tensor,
    images: Sequence[torch.Tensor],
    boxes: np.ndarray,
    resize: np.ndarray,
    windows: np.ndarray,
    flips: np.ndarray,
    dest: np.ndarray,
    method: str = "auto",
) -> None:
    """Writes each image's row into ``out``: its box resized (antialiased bilinear) to its
    resize, the window of ``out``'s size at its window, flipped left-right where its flip
    is set, into batch row ``dest``. Other rows of ``out`` are left as they are.

    On CUDA the work is queued on the current stream, with no host synchronization; the
    images must stay alive until it has run (the caller keeps them, as for any kernel).

    Args:
        out: uint8 N×3×H×W, channels_last (N×H×W×3 in memory): the batch.
        images: The decoded images, H×W×3 uint8 on ``out``'s device.
        boxes: int R×4, (y0, x0, y1, x1) of each image's box, in its image's pixels.
        resize: int R×2, the (height, width) each box is resized to.
        windows: int R×2, the (top, left) of each row's H×W window inside its resize.
        flips: bool R, flip left-right after the window.
        dest: int R, the batch row of each image.
        method: ``"triton"``, ``"float"``, ``"uint8"`` (see the module) or ``"auto"``
            (:func:`method_for`).

    Raises:
        ValueError: A method not in :data:`METHODS`, an ``out`` not uint8 N×3×H×W
            channels_last, images on another device, or tables that do not fit (see
            :func:`row_table`).
        ImportError: ``method="triton"`` without Triton.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if out.dtype != torch.uint8 or out.dim() != 4 or out.shape[1] != 3:
        raise ValueError(f"out must be uint8 N×3×H×W, got {out.dtype} {tuple(out.shape)}")
    if not out.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("out must be channels_last (N×H×W×3 in memory)")
    elsewhere = [r for r, t in enumerate(images) if t.device != out.device]
    if elsewhere:  # the kernel would read another device's addresses
        raise ValueError(f"images {elsewhere[:5]} are not on out's device {out.device}")
    out_size = (int(out.shape[2]), int(out.shape[3]))
    method = method_for(out.device) if method == "auto" else method
    if method == "triton":
        _launch(out, images, boxes, resize, windows, flips, dest, out_size)
    else:
        row_table(images, boxes, resize, windows, flips, dest, out_size)  # the same checks
        _loop(out, images, boxes, resize, windows, flips, dest, out_size, method == "float")


def _launch(
    out: torch.Tensor,
    images: Sequence[torch.Tensor],
    boxes: np.ndarray,
    resize: np.ndarray,
    windows: np.ndarray,
    flips: np.ndarray,
    dest: np.ndarray,
    out_size: tuple[int, int],
) -> None:
    run = kernel(interpret=out.device.type == "cpu")
    # A line-strided view (a region of a whole decode) is read in place; anything else packed.
    images = [t if t.dim() == 3 and t.stride()[1:] == (3, 1) else t.contiguous() for t in images]
    table = row_table(images, boxes, resize, windows, flips, dest, out_size)
    if not len(table):
        return
    h, w = out_size
    if out.device.type == "cpu":
        grid = ((h * w + BLOCK_INTERPRETED - 1) // BLOCK_INTERPRETED, len(table))
        run[grid](out, table, h, w, BLOCK=BLOCK_INTERPRETED)
        return
    # Pinned, so the copy is queued on the current stream without blocking the host; the
    # caching host allocator keeps the pinned block until the copy has run.
    table = table.pin_memory().to(out.device, non_blocking=True)
    with torch.cuda.device(out.device):  # Triton launches on the current device's current stream
        run[((h * w + BLOCK - 1) // BLOCK, len(table))](out, table, h, w, BLOCK=BLOCK)


def _loop(
    out: torch.Tensor,
    images: Sequence[torch.Tensor],
    boxes: np.ndarray,
    resize: np.ndarray,
    windows: np.ndarray,
    flips: np.ndarray,
    dest: np.ndarray,
    out_size: tuple[int, int],
    as_float: bool,
) -> None:
    """The reference: one ``F.interpolate`` per row (float32 rounded once, or uint8)."""
    h, w = out_size
    for r, img in enumerate(images):
        y0, x0, y1, x1 = (int(v) for v in boxes[r])
        x = img[y0:y1, x0:x1].permute(2, 0, 1).unsqueeze(0)
        x = F.interpolate(
            x.float() if as_float else x,
            size=(int(resize[r][0]), int(resize[r][1])),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        )
        top, left = (int(v) for v in windows[r])
        x = x[0, :, top : top + h, left : left + w]
        if flips[r]:
            x = x.flip(-1)
        if as_float:
            x = x.round().clamp_(0, 255)
        out[int(dest[r])].copy_(x)
