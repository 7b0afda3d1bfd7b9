"""What the workers hand the device with ``decode="gpu"``: a batch packed for the GPU.

:class:`EncodedBatch` is the seam between the GPU's worker side (:mod:`fastload.sources.packed`
packs it) and the device (:mod:`fastload.device.gpudecode` decodes it), as
:class:`~fastload.HostBatch` is for final pixels; :data:`SourceBatch` is either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import torch

from .batch import HostBatch, Lease, Packed, SkippedSample, carried, landed, travelling
from .views import Images, is_views

__all__ = ["EncodedBatch", "SourceBatch", "ViewTable"]


@dataclass(frozen=True)
class ViewTable:
    """How each encoded row of a batch becomes its row of one view (see :class:`EncodedBatch`).

    Attributes:
        boxes: int64 R×4: (y0, x0, y1, x1) cut from the decoded pixels.
        resize: int64 R×2: (height, width) the box is resized to.
        windows: int64 R×2: (top, left) of the output inside the resized box.
        flips: bool R: flipped left-right after the resize.
        out_size: (H, W) of the view.
    """

    boxes: np.ndarray
    resize: np.ndarray
    windows: np.ndarray
    flips: np.ndarray
    out_size: tuple[int, int]


@dataclass
class EncodedBatch:
    """One batch of N rows: R encoded, M already decoded (R + M = N).

    With a multi-view transform (:class:`fastload.transforms.MultiView`) each encoded image
    is decoded once and makes a row of every view: the geometry fields below are the first
    view's, :attr:`more_views` the others' (:meth:`views` gives them all), and ``decoded``
    is a tuple of M×H×W×C tensors, one per view.

    Attributes:
        data: uint8, the encoded rows' bytes end to end.
        offsets: int64 R+1: encoded row r is ``data[offsets[r]:offsets[r + 1]]``.
        rows: int64 R: the batch row of each encoded image.
        sizes: int64 R×2: full-size (height, width), from each header.
        regions: int64 R×4: (y0, x0, y1, x1) to decode as a region; -1s: a full decode.
        boxes, resize, windows, flips: The first view's (see :class:`ViewTable`).
        decoded: uint8 M×H×W×C: the decoded rows, final pixels (a tuple, one per view).
        decoded_rows: int64 M: their batch rows.
        labels: The N targets, as in :class:`fastload.HostBatch`.
        indices: int64 N: the dataset index of each row (after replacements).
        epoch: The epoch of the batch.
        skipped: Samples replaced under ``on_error="skip"``.
        out_size: (H, W) of the first view's rows.
        seed: The seed of the batch's draws (a row the decoder refuses is loaded with it).
        cpu_share_rows: How many of the M decoded rows the GPU could have taken: those the
            request's ``cpu_share`` handed to the worker (:func:`shared_rows`).
        cpu_seconds: The worker's time loading those rows (wall clock).
        names: R: each encoded row's name (a stream's record: where it was read), for a
            refused row's errors.
        verified: bool R: each encoded row's bytes were verified strictly before (its plan's).
        holes: int64: the rows of a stream's records that failed under ``on_error="skip"``,
            for the device to fill from a good row of the batch (their own record is in
            ``skipped``).
        more_views: A multi-view batch's views after the first, in view order.
        data_lease, decoded_lease: Set when ``data`` or ``decoded`` is a reused buffer (a
            worker's, :mod:`fastload.sources.handoff`): see :meth:`release`.
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
    decoded: Images
    decoded_rows: np.ndarray
    labels: torch.Tensor
    indices: torch.Tensor
    epoch: int
    skipped: tuple[SkippedSample, ...]
    out_size: tuple[int, int]
    seed: int = 0
    cpu_share_rows: int = 0
    cpu_seconds: float = 0.0
    names: tuple[str, ...] = ()
    verified: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    holes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    more_views: tuple[ViewTable, ...] = ()
    data_lease: Lease | None = field(default=None, repr=False, compare=False)
    decoded_lease: Lease | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def multiview(self) -> bool:
        """Whether the batch's pixels are a tuple of views (a MultiView's), even of one."""
        return is_views(self.decoded)

    def views(self) -> tuple[ViewTable, ...]:
        """Every view's table, in view order (one for a single view)."""
        first = ViewTable(self.boxes, self.resize, self.windows, self.flips, self.out_size)
        return (first, *self.more_views)

    def encoded(self, r: int) -> np.ndarray:
        """The bytes of encoded row ``r`` (a view)."""
        return self.data.numpy()[self.offsets[r] : self.offsets[r + 1]]

    def release(self, event: Any = None) -> None:
        """Gives its reused buffers back, as :meth:`fastload.HostBatch.release` does (idempotent;
        a no-op for a batch that owns its memory)."""
        leases, self.data_lease, self.decoded_lease = (self.data_lease, self.decoded_lease), None, None
        for lease in leases:
            if lease is not None:
                lease.release(event)

    def __reduce__(self):
        return self.packed().__reduce__()

    def packed(self) -> Packed:
        """This batch made ready to cross to another process now, as :meth:`fastload.HostBatch.packed`:
        its bytes and decoded rows as their buffers' leases where they are in a worker's buffer,
        every other tensor by value (torch's shared memory would leave a segment in /dev/shm
        for a batch never received)."""
        values = dict(vars(self))  # every field, as a dataclass keeps them
        values.update(
            data=carried(self.data, self.data_lease),
            decoded=carried(self.decoded, self.decoded_lease),
            labels=travelling(self.labels),
            indices=travelling(self.indices),
        )
        return Packed(_arrived, (values,))

    def region(self, r: int) -> tuple[int, int, int, int] | None:
        """The region of encoded row ``r``, or None for a full decode."""
        y0, x0, y1, x1 = (int(v) for v in self.regions[r])
        return None if y0 < 0 else (y0, x0, y1, x1)


def _arrived(values: dict[str, Any]) -> EncodedBatch:
    """An EncodedBatch unpickled: its bytes and decoded rows mapped from their buffers, or rebuilt."""
    values.update(
        data=landed(values["data"], values["data_lease"]),
        decoded=landed(values["decoded"], values["decoded_lease"]),
        labels=landed(values["labels"], None),
        indices=landed(values["indices"], None),
    )
    return EncodedBatch(**values)


#: What a batch source yields and the device driver takes: a host batch of final pixels, or
#: (``decode="gpu"``) a batch packed for the device.
SourceBatch: TypeAlias = "HostBatch | EncodedBatch"
