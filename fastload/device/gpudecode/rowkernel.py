"""The Triton kernel of :mod:`.rows`: every row of a batch cut, resized, windowed, flipped
and rounded in one launch. Imported only by :func:`.rows.kernel` (it needs Triton).

The math is PyTorch's CUDA ``_upsample_bilinear2d_aa`` (``upsample_gen2d_aa_out_frame``
with ``_compute_weights_span`` / ``_compute_weights`` of ATen's ``UpSample.cuh``), in
float32 as there: for an output index ``i`` of an axis resized from ``n`` to ``m``,
``scale = n / m``, ``support = max(scale, 1)``, ``center = scale * (i + 0.5)``, inputs
``xmin = max(int(center - support + 0.5), 0)`` to ``min(int(center + support + 0.5), n)``
(excluded), each weighted ``max(0, 1 - |(j + xmin - center + 0.5) / support|)`` over the
weights' sum; the horizontal sums of each input row first, then the vertical one.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

__all__ = ["COLUMNS", "compiled", "interpreted"]

#: The int64 columns of a row of the table (:func:`.rows.row_table`).
COLUMNS = ("src", "pitch", "in_h", "in_w", "resize_h", "resize_w", "top", "left", "flip", "dest")


def _rows(out_ptr, table_ptr, out_h, out_w, BLOCK: tl.constexpr):
    r = tl.program_id(1)
    row = table_ptr + r * 10
    # The box's top-left pixel, an address: each row reads its own decoded image in place.
    src = tl.load(row).to(tl.pointer_type(tl.uint8))
    pitch = tl.load(row + 1)
    in_h = tl.load(row + 2)
    in_w = tl.load(row + 3)
    scale_y = in_h.to(tl.float32) / tl.load(row + 4).to(tl.float32)
    scale_x = in_w.to(tl.float32) / tl.load(row + 5).to(tl.float32)
    top = tl.load(row + 6)
    left = tl.load(row + 7)
    flip = tl.load(row + 8)
    dest = tl.load(row + 9)

    pix = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = pix < out_h * out_w
    oy = pix // out_w
    ox = pix % out_w
    # The window of the resized box, flipped left-right after the cut where the row says so.
    sx = tl.where(flip != 0, out_w - 1 - ox, ox) + left
    sy = oy + top

    # _compute_weights_span: support is the scale when shrinking, 1 when enlarging.
    support_y = tl.maximum(scale_y, 1.0)
    support_x = tl.maximum(scale_x, 1.0)
    center_y = scale_y * (sy.to(tl.float32) + 0.5)
    center_x = scale_x * (sx.to(tl.float32) + 0.5)
    ymin = tl.maximum((center_y - support_y + 0.5).to(tl.int32), 0)
    xmin = tl.maximum((center_x - support_x + 0.5).to(tl.int32), 0)
    ysize = tl.where(live, tl.minimum((center_y + support_y + 0.5).to(tl.int32), in_h.to(tl.int32)) - ymin, 0)
    xsize = tl.where(live, tl.minimum((center_x + support_x + 0.5).to(tl.int32), in_w.to(tl.int32)) - xmin, 0)
    ymc = ymin.to(tl.float32) - center_y
    xmc = xmin.to(tl.float32) - center_x
    inv_y = 1.0 / support_y
    inv_x = 1.0 / support_x
    # A span has at most 2 * ceil(support) + 1 inputs. The loops are while loops on
    # purpose, and only Triton builtins are called (no tl.zeros, tl.max): Triton's
    # interpreter cannot take a tensor as a range() bound (numpy 2 refuses int() of its
    # 1-element arrays), and runs its library's jit functions only when TRITON_INTERPRET=1
    # was set before Triton was imported, which would make every kernel interpreted.
    ky_end = tl.ceil(support_y).to(tl.int32) * 2 + 1
    kx_end = tl.ceil(support_x).to(tl.int32) * 2 + 1

    # _compute_weights normalizes by the sum of the unnormalized weights: sum them first.
    total_y = tl.full([BLOCK], 0.0, tl.float32)
    k = 0
    while k < ky_end:
        w = tl.maximum(1.0 - tl.abs((k + ymc + 0.5) * inv_y), 0.0)
        total_y += tl.where(k < ysize, w, 0.0)
        k += 1
    total_x = tl.full([BLOCK], 0.0, tl.float32)
    k = 0
    while k < kx_end:
        w = tl.maximum(1.0 - tl.abs((k + xmc + 0.5) * inv_x), 0.0)
        total_x += tl.where(k < xsize, w, 0.0)
        k += 1
    total_y = tl.where(total_y != 0.0, total_y, 1.0)
    total_x = tl.where(total_x != 0.0, total_x, 1.0)

    c = tl.arange(0, 4)  # HWC: 3 channels, a fourth masked off (blocks are powers of 2)
    has_c = c[None, :] < 3
    acc = tl.full([BLOCK, 4], 0.0, tl.float32)
    ky = 0
    while ky < ky_end:
        wy = tl.maximum(1.0 - tl.abs((ky + ymc + 0.5) * inv_y), 0.0) / total_y
        line = src + (ymin + ky).to(tl.int64) * pitch
        across = tl.full([BLOCK, 4], 0.0, tl.float32)
        kx = 0
        while kx < kx_end:
            wx = tl.maximum(1.0 - tl.abs((kx + xmc + 0.5) * inv_x), 0.0) / total_x
            take = (kx < xsize) & (ky < ysize)
            at = line + ((xmin + kx) * 3).to(tl.int64)
            v = tl.load(at[:, None] + c[None, :], mask=take[:, None] & has_c, other=0)
            across += v.to(tl.float32) * wx[:, None]
            kx += 1
        acc += across * wy[:, None]
        ky += 1

    # torch.round (half to even), then clamp: the pixels are uint8.
    up = tl.floor(acc + 0.5)
    odd = (up - 2.0 * tl.floor(up * 0.5)) != 0.0
    up = tl.where(((up - acc) == 0.5) & odd, up - 1.0, up)
    px = tl.minimum(tl.maximum(up, 0.0), 255.0).to(tl.uint8)
    at = ((dest * out_h + oy) * out_w + ox) * 3
    tl.store(out_ptr + at[:, None] + c[None, :], px, mask=live[:, None] & has_c)


#: For CUDA tensors.
compiled = triton.jit(_rows)
#: Triton's interpreter, for CPU tensors (tests; what ``TRITON_INTERPRET=1`` would make).
interpreted = InterpretedFunction(_rows)
