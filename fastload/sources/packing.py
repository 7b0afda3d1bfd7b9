"""A GPU batch's rows as the worker packs them: the transforms' seam, and the packing itself.

:class:`GpuRows` is what the worker side of ``decode="gpu"`` (:mod:`fastload.sources.packed`)
asks of the transforms as the device runs them (:mod:`fastload.device.gpudecode.pipeline`,
a layer above): each planned row's geometry, one per view, and its flips. :func:`pack` lays
the rows out as an :class:`~fastload.encoded.EncodedBatch`: bytes end to end in one buffer,
a table of geometry per view, the rows the CPU path built as final pixels (one tensor per
view for a multi-view transform). Both buffers are leased from the source's pool, as a CPU
batch's pixels are (:mod:`fastload.sources.pools`: a worker process's reused buffers, which
the main process copies a batch out of on arrival), so nothing is left in ``/dev/shm`` by a
batch never received.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

import numpy as np
import torch

from ..batch import SkippedSample
from ..encoded import EncodedBatch, ViewTable
from ..transforms import DecodeSteps, ViewSteps
from ..views import SampleShape, batch_shape, of_views, shapes
from .neighbours import Owed
from .pools import BatchBuffers, BufferPool, Need

_Made = TypeVar("_Made")


class RowGeometry(Protocol):
    """How the device turns one decoded image into its row of one view (see
    :class:`fastload.device.gpudecode.pipeline.Geometry`)."""

    region: tuple[int, int, int, int] | None
    box: tuple[int, int, int, int]
    resize: tuple[int, int]
    window: tuple[int, int]


class GpuRows(Protocol):
    """The transforms as the device runs them (:class:`fastload.device.gpudecode.GpuPipeline`,
    or :class:`~fastload.device.gpudecode.pipeline.GpuViews` for a MultiView)."""

    @property
    def views(self) -> bool:
        """Whether a batch's pixels are a tuple of views."""

    @property
    def out_sizes(self) -> tuple[tuple[int, int], ...]:
        """(height, width) of each view."""

    def plan(self, steps: DecodeSteps | ViewSteps) -> Sequence[RowGeometry] | None:
        """A planned row's geometry for each view (one region for all); None: the CPU path's row."""

    def draw_flips(self, rng: np.random.Generator) -> tuple[bool, ...]:
        """A row's flips, one per view, drawn from its generator after its crops."""


@dataclass
class EncodedRow:
    """One row the GPU will decode, as the worker planned it."""

    row: int
    data: bytes | np.ndarray
    height: int
    width: int
    geometry: Sequence[RowGeometry]  # one per view, all with the same region
    flips: tuple[bool, ...]  # one per view
    name: str = ""  # names it where the device must (a refused row's errors)
    verified: bool = False  # its plan's: the device plans a refused stream row again from its bytes


def lease(pool: BufferPool, n: int, sample: SampleShape, worker: int) -> BatchBuffers:
    """A uint8 buffer of ``n`` rows of ``sample`` (one per view) leased from ``pool`` for
    ``worker``; an empty one needs none."""
    if n:
        return pool.lease(Need(n, sample, worker=worker))
    empty = tuple(torch.empty(shape, dtype=torch.uint8) for shape in shapes(batch_shape(0, sample)))
    return BatchBuffers(empty if of_views(sample) else empty[0])


def pixels(pool: BufferPool, n: int, rows: GpuRows, worker: int) -> BatchBuffers:
    """A buffer for ``n`` rows of final pixels: N×H×W×3, one per view (a tuple for views)."""
    sample = tuple((h, w, 3) for h, w in rows.out_sizes)
    return lease(pool, n, sample if rows.views else sample[0], worker)


def holding(pool: BufferPool, worker: int, make: Callable[[list[BatchBuffers]], _Made]) -> _Made:
    """``make(held)``, which leases its batch's buffers from ``pool`` into ``held``: they are
    given back when the batch is never handed on (it failed while packed, or it is owed)."""
    held: list[BatchBuffers] = []
    try:
        made = make(held)
    except BaseException:
        for buffers in held:
            pool.abandon(buffers, worker)
        raise
    if isinstance(made, Owed):
        for buffers in held:
            pool.abandon(buffers, worker)
    return made


def pack(
    encoded: list[EncodedRow],
    decoded: list[int],
    pixels: BatchBuffers,
    labels: torch.Tensor,
    indices: torch.Tensor,
    epoch: int,
    skipped: tuple[SkippedSample, ...],
    out_sizes: tuple[tuple[int, int], ...],
    seed: int = 0,
    cpu_share_rows: int = 0,
    cpu_seconds: float = 0.0,
    holes: Sequence[int] = (),
    *,
    pool: BufferPool,
    worker: int,
    held: list[BatchBuffers],
) -> EncodedBatch:
    """The EncodedBatch of ``encoded`` rows and the rows ``decoded`` on the CPU, whose final
    pixels ``pixels`` holds (with their lease); the bytes go into a buffer leased from ``pool``
    for ``worker``, which joins the batch's buffers ``held`` (see :func:`holding`)."""
    r = len(encoded)
    lengths = np.fromiter((len(e.data) for e in encoded), np.int64, r)
    offsets = np.zeros(r + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    bytes_ = lease(pool, int(offsets[-1]), (), worker)
    held.append(bytes_)
    data = cast(torch.Tensor, bytes_.images)
    flat = data.numpy()
    for e, start, end in zip(encoded, offsets[:-1], offsets[1:]):
        flat[start:end] = np.frombuffer(e.data, np.uint8) if isinstance(e.data, (bytes, bytearray)) else e.data

    def table(values: list, width: int) -> np.ndarray:
        return np.asarray(values, np.int64).reshape(r, width)

    views = [
        ViewTable(
            boxes=table([e.geometry[v].box for e in encoded], 4),
            resize=table([e.geometry[v].resize for e in encoded], 2),
            windows=table([e.geometry[v].window for e in encoded], 2),
            flips=np.fromiter((e.flips[v] for e in encoded), bool, r),
            out_size=(int(size[0]), int(size[1])),
        )
        for v, size in enumerate(out_sizes)
    ]
    regions = [e.geometry[0].region for e in encoded]  # the one decode all the views are cut from
    return EncodedBatch(
        data=data,
        offsets=offsets,
        rows=np.fromiter((e.row for e in encoded), np.int64, r),
        sizes=table([(e.height, e.width) for e in encoded], 2),
        regions=table([g if g is not None else (-1, -1, -1, -1) for g in regions], 4),
        boxes=views[0].boxes,
        resize=views[0].resize,
        windows=views[0].windows,
        flips=views[0].flips,
        decoded=pixels.images,
        decoded_rows=np.asarray(decoded, np.int64),
        labels=labels,
        indices=indices,
        epoch=epoch,
        skipped=skipped,
        out_size=views[0].out_size,
        seed=seed,
        cpu_share_rows=cpu_share_rows,
        cpu_seconds=cpu_seconds,
        names=tuple(e.name for e in encoded),
        verified=np.fromiter((e.verified for e in encoded), bool, r),
        holes=np.asarray(holes, np.int64),
        more_views=tuple(views[1:]),
        data_lease=bytes_.lease,
        decoded_lease=pixels.lease,
    )
