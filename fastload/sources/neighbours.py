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
batch: a failed record's row is then a hole (:class:`Holes`) that the device fills from its
batch's good rows (:func:`fastload.device.gpudecode.refused.fill_holes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..batch import SkippedSample
from .fetch import Failed, Loaded


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


class Neighbours:
    """One reading slot's neighbours: its last good record (for the rows after it) and its first."""

    def __init__(self) -> None:
        self.last: Loaded | None = None
        self.first: Loaded | None = None

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
