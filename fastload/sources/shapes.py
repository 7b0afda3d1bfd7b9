"""Under ``on_error="skip"``, images of the wrong shape that dominate are an error of the
data, not of the samples.

A batch's sample shape is learnt once per epoch and process (:meth:`BatchMaker.head
<fastload.sources.maker.BatchMaker.head>`, by majority of its first samples); an image of
another shape is then the error of its sample, replaced under "skip". Where the images really
differ in size (no transform with a fixed output size), or the shape was learnt from an odd
sample (a stream's slot, whose first record decides at batch size 1 or 2), skipping them
would fill the epoch with the few samples of the learnt shape, silently: one sample repeated
at batch size 1. So the loader counts, per process and epoch, the images checked against
their batch's shape (replacements included; the rows that taught the shape not), and raises
:class:`ShapesDiffer` (never skipped), naming the shapes seen, when

- :data:`NONE_FIT` images did not fit and none has since the epoch began (the learnt shape
  is an odd one's), or
- :data:`MANY_MISFITS` did not fit and they outnumber those that did.

Counted from an epoch's start, a run of odd images early in it must not trip this. The
chance that an epoch of 1,000 images per process trips it (exactly, for independent images):
1 in 10^10 with 10% of them odd, 1 in 6 million with 20%, 1 in 1,600 with 30%, 1 in 11 with
40%.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from ..views import SampleShape

__all__ = ["MANY_MISFITS", "NONE_FIT", "ShapeTally", "ShapesDiffer"]

NONE_FIT = 10  # misfits with no fit at all: the learnt shape is an odd image's
MANY_MISFITS = 32  # misfits that, outnumbering the fits, say the images differ in size


class ShapesDiffer(ValueError):
    """Most images checked in an epoch do not have the batch's shape (raised under "skip" too)."""


class ShapeTally:
    """The images of one process's epoch checked against their batch's shape (thread-safe:
    the thread backend's loader is shared)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._fits = 0
        self._misfits: collections.Counter[SampleShape] = collections.Counter()

    def __getstate__(self) -> dict:
        return {"fresh": True}  # a worker started by spawn or forkserver counts its own epochs afresh

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # type: ignore[misc]

    def count(self, epoch: int, expected: SampleShape, got: SampleShape, title: Callable[[], str]) -> None:
        """Counts one image of ``epoch`` (``got``, its batch's ``expected``); ``title()`` names it.

        Raises:
            ShapesDiffer: ``got`` misfits, and the misfits dominate (see the module doc).
        """
        with self._lock:
            if self._epoch != epoch:
                self._epoch, self._fits = epoch, 0
                self._misfits.clear()
            if got == expected:
                self._fits += 1
                return
            self._misfits[got] += 1
            misfits, fits = sum(self._misfits.values()), self._fits
            if not ((misfits >= NONE_FIT and fits == 0) or (misfits >= MANY_MISFITS and misfits > fits)):
                return
            seen = ", ".join(f"{tuple(s)} x{n}" for s, n in self._misfits.most_common(4))
        raise ShapesDiffer(
            f"on_error='skip': {misfits} of the {misfits + fits} images checked in epoch {epoch} here do not "
            f"have the batch's shape {tuple(expected)} (learnt from the epoch's first samples), the latest "
            f"{title()}; seen: {seen}. Skipping them would fill the epoch with the few that fit. The images "
            "differ in size: use a transform with a fixed output size (e.g. RandomResizedCrop or CenterCrop)"
        )
