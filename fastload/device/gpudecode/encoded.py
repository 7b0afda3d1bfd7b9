"""EncodedBatch: a batch as workers hand it to the GPU decode stage, bytes and plans.

Rows the GPU decodes ("encoded rows") travel as their JPEG bytes, end to end in one
shared-memory buffer, with each row's geometry. Rows the GPU decoder cannot take (not
a JPEG, CMYK, progressive, cut short, or failing to plan) were loaded by the CPU path
in the worker, cropped, resized and flipped, and travel as pixels ("decoded rows").
Small per-row values are numpy arrays, pickled with the batch; the two large buffers
are tensors in shared memory, so nothing large is copied on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...batch import SkippedSample
from ...collate import alloc_batch
from .pipeline import Geometry


@dataclass
class EncodedBatch:
    """One batch of N rows: R encoded, M already decoded (R + M = N).

    Attributes:
        data: uint8, the encoded rows' bytes end to end.
        offsets: int64 R+1: encoded row r is ``data[offsets[r]:offsets[r + 1]]``.
        rows: int64 R: the batch row of each encoded image.
        sizes: int64 R×2: full-size (height, width), from each header.
        regions: int64 R×4: (y0, x0, y1, x1) to decode as a region; -1s: a full decode.
        boxes: int64 R×4: (y0, x0, y1, x1) cut from the decoded pixels.
        resize: int64 R×2: (height, width) the box is resized to.
        windows: int64 R×2: (top, left) of the output inside the resized box.
        flips: bool R: flipped left-right after the resize.
        decoded: uint8 M×H×W×C: the decoded rows, final pixels.
        decoded_rows: int64 M: their batch rows.
        labels: The N targets, as in :class:`fastload.HostBatch`.
        indices: int64 N: the dataset index of each row (after replacements).
        epoch: The epoch of the batch.
        skipped: Samples replaced under ``on_error="skip"``.
        out_size: (H, W) of every row.
    """

    data: torch.Tensor
    offsets: np.ndarray
    rows: np.ndarray
    sizes: np.ndarray
    regions: np.ndarray
    boxes: np.ndarray
    resize: np.ndarray
    windows: np.ndarray
    flips: np.ndarray
    decoded: torch.Tensor
    decoded_rows: np.ndarray
    labels: torch.Tensor
    indices: torch.Tensor
    epoch: int
    skipped: tuple[SkippedSample, ...]
    out_size: tuple[int, int]

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def encoded(self, r: int) -> np.ndarray:
        """The bytes of encoded row ``r`` (a view)."""
        return self.data.numpy()[self.offsets[r] : self.offsets[r + 1]]

    def region(self, r: int) -> tuple[int, int, int, int] | None:
        """The region of encoded row ``r``, or None for a full decode."""
        y0, x0, y1, x1 = (int(v) for v in self.regions[r])
        return None if y0 < 0 else (y0, x0, y1, x1)


@dataclass
class EncodedRow:
    """One row the GPU will decode, as the worker planned it."""

    row: int
    data: bytes | np.ndarray
    height: int
    width: int
    geometry: Geometry
    flip: bool


def _buffer(shape: tuple[int, ...]) -> torch.Tensor:
    # Shared memory in a worker; an empty one needs none.
    return alloc_batch(shape, pin=False) if np.prod(shape) else torch.empty(shape, dtype=torch.uint8)


def pack(
    encoded: list[EncodedRow],
    decoded: list[tuple[int, np.ndarray]],
    labels: torch.Tensor,
    indices: torch.Tensor,
    epoch: int,
    skipped: tuple[SkippedSample, ...],
    out_size: tuple[int, int],
) -> EncodedBatch:
    """The EncodedBatch of ``encoded`` rows and ``decoded`` (row, pixels) pairs; the two
    buffers are allocated where the batch goes next (shared memory in a worker)."""
    r = len(encoded)
    lengths = np.fromiter((len(e.data) for e in encoded), np.int64, r)
    offsets = np.zeros(r + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = _buffer((int(offsets[-1]),))
    flat = data.numpy()
    for e, start, end in zip(encoded, offsets[:-1], offsets[1:]):
        flat[start:end] = np.frombuffer(e.data, np.uint8) if isinstance(e.data, (bytes, bytearray)) else e.data
    geometry = [e.geometry for e in encoded]
    channels = decoded[0][1].shape[2] if decoded else 3
    pixels = _buffer((len(decoded), *out_size, channels))
    rows = pixels.numpy()
    for k, (_, img) in enumerate(decoded):
        rows[k] = img  # a flipped view too; shapes were checked where each was loaded

    def table(values: list, width: int) -> np.ndarray:
        return np.asarray(values, np.int64).reshape(r, width)

    return EncodedBatch(
        data=data,
        offsets=offsets,
        rows=np.fromiter((e.row for e in encoded), np.int64, r),
        sizes=table([(e.height, e.width) for e in encoded], 2),
        regions=table([g.region if g.region is not None else (-1, -1, -1, -1) for g in geometry], 4),
        boxes=table([g.box for g in geometry], 4),
        resize=table([g.resize for g in geometry], 2),
        windows=table([g.window for g in geometry], 2),
        flips=np.fromiter((e.flip for e in encoded), bool, r),
        decoded=pixels,
        decoded_rows=np.fromiter((j for j, _ in decoded), np.int64, len(decoded)),
        labels=labels,
        indices=indices,
        epoch=epoch,
        skipped=skipped,
        out_size=tuple(out_size),
    )
