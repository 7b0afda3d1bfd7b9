"""A stream's replacement policy: a record that fails under ``on_error="skip"`` becomes its neighbour.

A stream cannot draw a random other record as an indexed dataset draws another index (its
records come in its slot's order, once), so a failed record's row is filled with its slot's
good neighbour: the last good record before it, else the first one after it. The slot's
count, and so its rank's batch count, stays the same. The batch builder
(:meth:`fastload.sources.maker.BatchMaker.build`) loads a stream's rows in place, asks here
which neighbour each failed row takes (:meth:`Neighbours.choose`) and copies it in. A batch
whose rows all failed, in a slot with no good record yet, is owed (:class:`Owed`): its rows
become copies of the slot's first good record once one is read.

With ``decode="gpu"`` most rows are decoded on the device, after the worker is done with the
batch: a failed record's row whose neighbour is a row of its batch is a hole (:class:`Holes`)
the device fills (:func:`fastload.device.gpudecode.refused.neighbour_rows`); the slot's last
and first good records are kept as a packed row copies them (:class:`Kept`: the bytes and
geometry the GPU decodes again to the same pixels, or the CPU path's pixels).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..batch import SkippedSample
from ..collate import write_row
from ..targets import Target
from ..views import Images, map_images, numpy_rows, row
from .fetch import Failed, Loaded

if TYPE_CHECKING:
    from .packing import EncodedRow


@dataclass
class Owed:
    """A batch of a stream's slot whose records all failed before the slot had a good one:
    the records of its failures, in row order."""

    skipped: list[SkippedSample]


def _kept(item: Loaded) -> Loaded:
    """``item`` with its own copy of its pixels (its row's buffer is lent again)."""
    image = item.image
    own = tuple(np.array(v) for v in image) if isinstance(image, tuple) else np.array(image)
    return dataclasses.replace(item, image=own)


class Replaces(Protocol):
    """How the batch builder fills the rows of a stream's failed records
    (:meth:`fastload.sources.maker.BatchMaker.build`)."""

    @property
    def last(self) -> Loaded | None:
        """The good record a ``(j, None)`` of :meth:`choose` copies."""

    def choose(self, items: list[Loaded | Failed]) -> list[tuple[int, int | None]] | None:
        """For each failed row j of ``items``, the row k it copies, or None (:attr:`last`);
        None: the batch is owed."""

    def remember(self, good: list[Loaded]) -> None:
        """Hears of a batch's good records."""


@dataclass
class Kept:
    """A slot's good record as a later row copies it with ``decode="gpu"``.

    Attributes:
        label, index: Its target and record number.
        seed: The seed of its draws (a copy the device refuses is planned again with it).
        encoded: The bytes, geometry and flip it was packed with (the GPU decodes a copy to
            the same pixels); None for a row the CPU path built.
        pixels: That row's pixels (its own copy; one array per view), where ``encoded`` is None.
    """

    label: Target
    index: int
    seed: int
    encoded: EncodedRow | None = None
    pixels: np.ndarray | tuple[np.ndarray, ...] | None = None

    def copy_into(self, images: Images, rows: list[int]) -> None:
        """Its pixels written into ``rows`` of the host batch ``images`` (a CPU-built row's)."""
        assert self.pixels is not None, "a row packed for the GPU keeps no pixels"
        held = numpy_rows(images)
        for j in rows:
            write_row(
                row(held, j), self.pixels, f"the slot's kept record (sample {self.index}), standing in for a failed one"
            )


class Neighbours:
    """One reading slot's neighbours: its last good record (for the rows after it) and its
    first; with ``decode="gpu"`` as :class:`Kept` rows (:attr:`kept_last`, :attr:`kept_first`)."""

    def __init__(self) -> None:
        self.last: Loaded | None = None
        self.first: Loaded | None = None
        self.kept_last: Kept | None = None
        self.kept_first: Kept | None = None

    def choose(self, items: list[Loaded | Failed]) -> list[tuple[int, int | None]] | None:
        """For each failed row j of ``items`` (a batch's rows in slot order), its neighbour:
        ``(j, k)``, the good row k of the batch, or ``(j, None)``, the slot's last good record
        (:attr:`last`); None when every row failed and the slot has no good record yet (the
        batch is :class:`Owed`)."""
        good = [j for j, item in enumerate(items) if isinstance(item, Loaded)]
        if not good and self.last is None:
            return None
        chosen: list[tuple[int, int | None]] = []
        for j, item in enumerate(items):
            if isinstance(item, Failed):
                left = [k for k in good if k < j]
                chosen.append((j, left[-1] if left else None if self.last is not None else good[0]))
        return chosen

    def remember(self, good: list[Loaded]) -> None:
        """The slot's first and last good records, after a batch whose good records were ``good``."""
        if good and self.first is None:
            self.first = _kept(good[0])
        if good:
            self.last = _kept(good[-1])


@dataclass
class Holes:
    """A batch's failed rows left for the device to fill (``decode="gpu"``: their neighbours'
    pixels are decoded there). Each is written from a good row of the batch meanwhile, so the
    batch collates; :attr:`rows` says which."""

    rows: list[int] = field(default_factory=list)
    last: Loaded | None = None  # never chosen: a hole is filled from its own batch

    def choose(self, items: list[Loaded | Failed]) -> list[tuple[int, int | None]] | None:
        """Each failed row copies the batch's first good row for now; None when none is good."""
        good = [j for j, item in enumerate(items) if isinstance(item, Loaded)]
        self.rows = [j for j, item in enumerate(items) if isinstance(item, Failed)]
        return [(j, good[0]) for j in self.rows] if good else None

    def remember(self, good: list[Loaded]) -> None:
        """Nothing to remember: the device fills holes from their own batch."""


def from_slot(
    slot: Neighbours,
    seed: int,
    packed: list[tuple[EncodedRow, Target] | None],
    encoded: list[EncodedRow],
    cpu: list[int],
    holes: list[int],
    targets: list[Target],
    indices: np.ndarray,
    pixels: Images,
) -> tuple[Images, list[int]] | None:
    """A stream's batch packed for the GPU (:meth:`fastload.sources.packed.PackMaker.build`)
    with its ``slot`` (``encoded``, ``cpu``, ``targets`` and ``indices`` updated in place):
    its failed records (``holes``) that no good row of the batch precedes take the slot's
    last good record, as decode="cpu" fills them (a copy of its packed row, moved from the
    CPU's rows to the encoded ones; or its pixels); the slot keeps the batch's last (and
    first) good row.

    Returns:
        (the CPU rows' pixels, the holes left for the device: a good row of the batch
        fills each), or None: every record failed and the slot has none yet (owed).
    """
    gone = set(holes)
    good = [j for j in range(len(targets)) if j not in gone]
    before = slot.kept_last
    if good:

        def kept(j: int) -> Kept:
            entry = packed[j]
            if entry is not None:
                return Kept(targets[j], int(indices[j]), seed, encoded=entry[0])
            k = cpu.index(j)
            return Kept(targets[j], int(indices[j]), seed, pixels=map_images(lambda t: t[k].numpy().copy(), pixels))

        slot.kept_last = kept(good[-1])
        slot.kept_first = slot.kept_first or kept(good[0])
    early = [j for j in holes if not good or j < good[0]]
    if not early or before is None:  # none, or the first good row after them fills them (the device's rule)
        return (pixels, holes) if good else None
    for j in early:
        targets[j], indices[j] = before.label, before.index
    if before.encoded is None:
        before.copy_into(pixels, [cpu.index(j) for j in early])
    else:
        encoded.extend(dataclasses.replace(before.encoded, row=j) for j in early)
        keep = [k for k, j in enumerate(cpu) if j not in early]
        pixels, cpu[:] = map_images(lambda t: t[keep], pixels), [cpu[k] for k in keep]
    return pixels, [j for j in holes if j not in early]
