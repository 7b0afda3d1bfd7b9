"""A sample planned but not yet decoded: the seam that lets a batch be decoded in one call.

Every :class:`~fastload.ImageDataset` splits ``load(index, epoch, seed, out)`` in two:
:meth:`~fastload.ImageDataset.plan` reads the bytes and the header, draws the crop and
chooses the decode, and :meth:`~fastload.ImageDataset.finish` decodes, resizes and applies
the later transforms; ``load`` is ``finish(plan(...))``, so ``ds[i]``, a worker's sample
and a batch planned ahead decode alike. Between the two a batch source may decode the
regions of many samples in one call (:mod:`fastload.sources.batchplan`) or hand the bytes
to the GPU (:mod:`fastload.device.gpudecode`). Every plan of bytes not verified before is
as strict as a full decode: no such sample decodes that a full strict decode would refuse
(:mod:`fastload.decode.plan`); bytes whose checksum matches a strict verification
(:mod:`fastload.verified`) may take a cheaper plan, and bytes whose checksum no longer
matches are refused while planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..decode import ImageHeader
from ..decode.resize import Crop
from ..transforms import DecodeSteps, ViewSteps


@dataclass
class SamplePlan:
    """One sample between :meth:`ImageDataset.plan <fastload.ImageDataset.plan>` and
    :meth:`ImageDataset.finish <fastload.ImageDataset.finish>`.

    Attributes:
        index: The dataset index.
        data: The encoded image bytes.
        label: The target as the dataset read it.
        rng: The sample's generator, past the crop's draws: the later transforms (a
            flip) draw from it next, so a plan is finished once.
        steps: The header, the crop and the decode plan.
        verified: The bytes were verified strictly before (their CRC32C matched the
            dataset's record of it, :mod:`fastload.verified`), so the plan may be one that
            cannot see damage (a region decode); False: every plan is as strict as a full decode.
    """

    index: int
    data: Any
    label: Any
    rng: np.random.Generator
    steps: DecodeSteps | ViewSteps
    verified: bool = False

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
