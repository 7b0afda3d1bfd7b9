"""A sample planned but not yet decoded: the seam that lets a batch be decoded in one call.

A dataset that plans (:class:`Plannable`, every :class:`~fastload.ImageDataset`) splits
``load(index, epoch, seed, out)`` in two: :meth:`~Plannable.plan` reads the bytes and the
header and draws the crop, and :meth:`~Plannable.finish` decodes, resizes and applies the
later transforms. Between the two a batch source may decode the regions of many samples
in one call (:mod:`fastload.sources.batchplan`) or hand the bytes to the GPU
(:mod:`fastload.device.gpudecode`). ``finish(plan(i, e, s))`` is ``load(i, e, s)`` pixel for
pixel: the same draws from the same generator, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..decode import ImageHeader
from ..decode.resize import Crop
from ..transforms import DecodeSteps, ViewSteps


@dataclass
class SamplePlan:
    """One sample between :meth:`Plannable.plan` and :meth:`Plannable.finish`.

    Attributes:
        index: The dataset index.
        data: The encoded image bytes.
        label: The target as the dataset read it.
        rng: The sample's generator, past the crop's draws: the later transforms (a
            flip) draw from it next, so a plan is finished once.
        steps: The header, the crop and the decode plan.
    """

    index: int
    data: Any
    label: Any
    rng: np.random.Generator
    steps: DecodeSteps | ViewSteps

    @property
    def header(self) -> ImageHeader:
        return self.steps.header

    @property
    def crop(self) -> Crop | None:
        return self.steps.crop

    @property
    def region(self) -> tuple[int, int, int, int] | None:
        """(y0, x0, y1, x1) when a region decode was planned, else None."""
        return self.steps.region


@runtime_checkable
class Plannable(Protocol):
    """A dataset whose ``load`` is ``finish(plan(...))``."""

    def plan(self, index: int, epoch: int = 0, seed: int = 0) -> SamplePlan: ...

    def finish(
        self, plan: SamplePlan, pixels: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray: ...

    def describe(self, index: int) -> str: ...
