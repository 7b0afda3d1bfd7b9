"""Under ``on_error="skip"``, images of the wrong shape that outnumber the right ones are an
error of the data, not of the samples.

A batch's sample shape is learnt once per epoch and process (:meth:`BatchMaker.head
<fastload.sources.maker.BatchMaker.head>`, by majority of its first samples); an image of
another shape is then the error of its sample, replaced under "skip". Where the images really
differ in size (no transform with a fixed output size), or the shape was learnt from an odd
sample, skipping them would fill the epoch with the few samples of the learnt shape, silently:
one sample repeated at batch size 1. So the loader counts, per process and epoch, the images
checked against the batch's shape; once at least :data:`MIN_MISFITS` did not fit and they
outnumber those that did, the next misfit raises :class:`ShapesDiffer` (never skipped),
naming the shapes seen.
"""

from __future__ import annotations

import collections
import threading

from ..views import SampleShape

__all__ = ["MIN_MISFITS", "ShapeTally", "ShapesDiffer"]

MIN_MISFITS = 3  # misfits before the tally may judge: one odd image early is its sample's error


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
        return {}  # a worker started by spawn or forkserver counts its own epochs afresh

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # type: ignore[misc]

    def count(self, epoch: int, expected: SampleShape, got: SampleShape, title: str) -> None:
        """Counts one image of ``epoch`` (``got``, its batch's ``expected``).

        Raises:
            ShapesDiffer: ``got`` misfits, and misfits (at least MIN_MISFITS) outnumber fits.
        """
        with self._lock:
            if self._epoch != epoch:
                self._epoch, self._fits = epoch, 0
                self._misfits.clear()
            if got == expected:
                self._fits += 1
                return
            self._misfits[got] += 1
            misfits = sum(self._misfits.values())
            if misfits < MIN_MISFITS or misfits <= self._fits:
                return
            seen = ", ".join(f"{tuple(s)} x{n}" for s, n in self._misfits.most_common(4))
            fits = self._fits
        raise ShapesDiffer(
            f"on_error='skip': {misfits} of the {misfits + fits} images checked in epoch {epoch} here do not "
            f"have the batch's shape {tuple(expected)} (learnt from the epoch's first samples), the latest "
            f"{title}; seen: {seen}. Skipping them would fill the epoch with the few that fit. The images "
            "differ in size: use a transform with a fixed output size (e.g. RandomResizedCrop or CenterCrop)"
        )
