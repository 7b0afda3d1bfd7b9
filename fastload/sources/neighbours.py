"""A stream's replacement policy: a record that fails under ``on_error="skip"`` becomes its neighbour.

A stream cannot draw a random other record as an indexed dataset draws another index (its
records come in its slot's order, once), so a failed record's row is filled with its slot's
good neighbour: the last good record before it, else the first one after it. The slot's
count, and so its rank's batch count, stays the same. The batch builder
(:meth:`fastload.sources.maker.BatchMaker.build`) loads a stream's rows in place and hands
the batch's rows here (:meth:`Neighbours.fill`), which copies each failed row's neighbour into
it. A batch whose rows all failed, in a slot with no good record yet, is owed
(:class:`Owed`): its rows become copies of the slot's first good record once one is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..batch import SkippedSample
from ..views import row
from .fetch import Failed, Loaded, SampleLoader, put


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


class Neighbours:
    """One reading slot's neighbours: its last good record (for the rows after it) and its first."""

    def __init__(self) -> None:
        self.last: Loaded | None = None
        self.first: Loaded | None = None

    def fill(self, items: list[Loaded | Failed], images: Any, loader: SampleLoader) -> list[Loaded] | None:
        """``items`` (a batch's rows in slot order, loaded into ``images``) with each failed row
        filled by its neighbour, pixels copied into its row; None when every row failed and the
        slot has no good record yet (the batch is :class:`Owed`)."""
        good = [j for j, item in enumerate(items) if isinstance(item, Loaded)]
        if not good and self.last is None:
            return None
        out: list[Loaded] = []
        for j, item in enumerate(items):
            if isinstance(item, Loaded):
                out.append(item)
                continue
            left = [k for k in good if k < j]
            if left:
                source, pixels = items[left[-1]], row(images, left[-1])
            elif self.last is not None:
                source, pixels = self.last, self.last.image
            else:
                source, pixels = items[good[0]], row(images, good[0])
            assert isinstance(source, Loaded)
            put(row(images, j), dataclasses.replace(source, image=pixels), loader)
            out.append(dataclasses.replace(source, image=row(images, j), skipped=[item.skipped]))
        if good:
            if self.first is None:
                self.first = _kept(out[good[0]])
            self.last = _kept(out[good[-1]])
        return out
