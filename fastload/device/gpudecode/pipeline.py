"""Which transform pipelines GPU decode runs, and each sample's geometry there.

GPU decode runs the presets (:func:`fastload.transforms.train` and :func:`~fastload.transforms.eval`):
RandomResizedCrop or Resize + CenterCrop, antialiased, optionally followed by
RandomHorizontalFlip (:class:`GpuPipeline`), and a :class:`~fastload.transforms.MultiView`
whose every view is such a pipeline (:class:`GpuViews`: each image is decoded once, and each
view is cut from it). Their crops and flips are drawn in the worker from the sample's
generator, exactly as the CPU path draws them; the GPU then crops, resizes and flips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from ...decode.resize import Crop
from ...transforms import (
    Compose,
    DecodeSteps,
    MultiView,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ResizedCenterCrop,
    ViewSteps,
)

#: A RandomResizedCrop box (a MultiView's: the union of its views' boxes) covering less than
#: this share of the image is decoded as a region (nvJPEG and libjpeg-turbo decode only the
#: rows, and columns, it needs); larger boxes are decoded whole.
REGION_MAX_AREA = 0.5

CropPlanner = Union[RandomResizedCrop, ResizedCenterCrop]

_USE_CPU = "use decode='cpu' for other transforms"


@dataclass(frozen=True)
class Geometry:
    """How GPU decode turns one decoded image into its batch row (of one view).

    Attributes:
        region: (y0, x0, y1, x1) decoded as a region, in full-size pixels; None: a full decode.
        box: (y0, x0, y1, x1) cut from the decoded pixels (region coordinates for a region).
        resize: (height, width) the box is resized to (antialiased bilinear).
        window: (top, left) of the output inside the resized box.
    """

    region: tuple[int, int, int, int] | None
    box: tuple[int, int, int, int]
    resize: tuple[int, int]
    window: tuple[int, int]


def regional(views: tuple[Geometry, ...], height: int, width: int) -> tuple[Geometry, ...]:
    """``views`` (one image's geometries from a full decode) decoded as the region of their
    union box where it covers under :data:`REGION_MAX_AREA` of the image, else as they are.

    The boxes move into the region's coordinates; each view's pixels stay those of its box
    in the full decode (a region decode is exact there, as for a single view).
    """
    y0, x0 = min(g.box[0] for g in views), min(g.box[1] for g in views)
    y1, x1 = max(g.box[2] for g in views), max(g.box[3] for g in views)
    if (y1 - y0) * (x1 - x0) >= REGION_MAX_AREA * height * width:
        return views
    return tuple(
        Geometry((y0, x0, y1, x1), (g.box[0] - y0, g.box[1] - x0, g.box[2] - y0, g.box[3] - x0), g.resize, g.window)
        for g in views
    )


@dataclass(frozen=True)
class GpuPipeline:
    """The transforms of a dataset (or of one view), as GPU decode runs them.

    Attributes:
        crop: The leading crop planner.
        flip: The random flip after it, or None.
        out_size: (height, width) of every output image.
    """

    crop: CropPlanner
    flip: RandomHorizontalFlip | None
    out_size: tuple[int, int]

    @staticmethod
    def of(dataset: Any) -> GpuPipeline | GpuViews:
        """The GPU form of ``dataset.transform``: a :class:`GpuPipeline`, or :class:`GpuViews`
        for a MultiView.

        Raises:
            TypeError: ``dataset`` is not a fastload dataset (or stream) that plans its samples.
            ValueError: Its transforms are not ones GPU decode can run (the message says which).
        """
        from ...datasets.base import ImageDataset
        from ...datasets.protocols import load_traits_of
        from ...datasets.records import PlannedRecords

        # GPU decode runs the dataset's transforms itself: a planned fastload dataset's (or
        # stream's: its records are planned as they are read), no other.
        planned = isinstance(dataset, ImageDataset) and load_traits_of(dataset).planned
        if not (planned or isinstance(dataset, PlannedRecords)):
            raise TypeError(
                f"decode='gpu' needs a fastload dataset (ImageFolder, ImageList, LMDBDataset, "
                f"TFRecordDataset, TFRecordStream, WebDataset) that does not override load, got "
                f"{type(dataset).__name__}; use decode='cpu'"
            )
        if isinstance(dataset.transform, MultiView):
            return GpuViews.of(dataset.transform)
        return GpuPipeline.of_pipeline(dataset.transform)

    @classmethod
    def of_pipeline(cls, transform: Compose, where: str = "") -> GpuPipeline:
        """The GPU form of one pipeline; ``where`` says which view it is, for errors.

        Raises:
            ValueError: Transforms GPU decode cannot run (the message says which).
        """
        ts = list(transform.transforms)
        if not ts or not isinstance(ts[0], (RandomResizedCrop, ResizedCenterCrop)):
            raise ValueError(
                f"decode='gpu' runs RandomResizedCrop, or Resize(int) + CenterCrop (a shorter-side resize), first "
                f"(fl.transforms.train() / eval()), got {transform!r}{where}; {_USE_CPU}"
            )
        crop = ts[0]
        if not crop.antialias:
            raise ValueError(
                f"decode='gpu' resizes with antialiasing only, got {crop!r}{where}; use antialias=True or decode='cpu'"
            )
        rest = ts[1:]
        if len(rest) > 1 or (rest and not isinstance(rest[0], RandomHorizontalFlip)):
            raise ValueError(
                f"decode='gpu' runs at most a RandomHorizontalFlip after the crop, got {transform!r}{where}; {_USE_CPU}"
            )
        return cls(crop, rest[0] if rest else None, crop.size)

    @property
    def views(self) -> bool:
        """False: a batch's pixels are one tensor."""
        return False

    @property
    def out_sizes(self) -> tuple[tuple[int, int], ...]:
        """(height, width) of the one view."""
        return (self.out_size,)

    def plan(self, steps: DecodeSteps | ViewSteps) -> tuple[Geometry, ...] | None:
        """A planned sample's geometry (a tuple of one); None: it has no crop (the CPU path loads it)."""
        if not isinstance(steps, DecodeSteps) or steps.crop is None:
            return None
        return (self.geometry(steps.crop, steps.header.height, steps.header.width),)

    def draw_flips(self, rng: np.random.Generator) -> tuple[bool, ...]:
        """The sample's flip (a tuple of one), drawn after its crop, as the CPU path draws it."""
        return (self.draw_flip(rng),)

    def draw_flip(self, rng: np.random.Generator) -> bool:
        """This pipeline's flip from ``rng`` (no draw without a flip)."""
        return self.flip.draw(rng) if self.flip is not None else False

    def geometry(self, crop: Crop, height: int, width: int) -> Geometry:
        """GPU decode's work for ``crop`` (drawn by :attr:`crop`) of a ``height`` x ``width`` image."""
        return regional((self.whole(crop, height, width),), height, width)[0]

    def whole(self, crop: Crop, height: int, width: int) -> Geometry:
        """:meth:`geometry` from a full decode (no region)."""
        if isinstance(self.crop, ResizedCenterCrop):
            # Resize the whole image, then take the centre window: the CPU path's pixels
            # (its window resize computes exactly these output pixels).
            rh, rw = self.crop.out_size(height, width)
            ch, cw = self.crop.size
            return Geometry(
                None, (0, 0, height, width), (rh, rw), (int(round((rh - ch) / 2)), int(round((rw - cw) / 2)))
            )
        # RandomResizedCrop: whole pixels, as Crop.apply cuts them from a full-size decode.
        y0, x0 = min(int(round(crop.top)), height - 1), min(int(round(crop.left)), width - 1)
        y1 = max(min(int(round(crop.top + crop.height)), height), y0 + 1)
        x1 = max(min(int(round(crop.left + crop.width)), width), x0 + 1)
        return Geometry(None, (y0, x0, y1, x1), (crop.out_h, crop.out_w), (0, 0))


@dataclass(frozen=True)
class GpuViews:
    """A MultiView as GPU decode runs it: each image decoded once (whole, or the region of its
    views' union box), each view cut, resized and flipped from it into its own batch tensor.

    Attributes:
        members: Each view's pipeline, in view order (a MultiView's ``counts`` expanded).
    """

    members: tuple[GpuPipeline, ...]

    @classmethod
    def of(cls, transform: MultiView) -> GpuViews:
        """The GPU form of ``transform``.

        Raises:
            ValueError: A view's pipeline GPU decode cannot run (the message names the view).
        """
        members = []
        for k, (pipeline, count) in enumerate(zip(transform.pipelines, transform.counts)):
            member = GpuPipeline.of_pipeline(pipeline, f" (pipeline {k} of {transform!r})")
            members += [member] * count
        return cls(tuple(members))

    @property
    def views(self) -> bool:
        """True: a batch's pixels are a tuple of tensors, one per view (as the CPU path's)."""
        return True

    @property
    def out_sizes(self) -> tuple[tuple[int, int], ...]:
        """(height, width) of each view."""
        return tuple(m.out_size for m in self.members)

    def plan(self, steps: DecodeSteps | ViewSteps) -> tuple[Geometry, ...] | None:
        """A planned sample's geometry for each view (all the same region, or none); None: a
        view without a crop (the CPU path loads it)."""
        if not isinstance(steps, ViewSteps) or len(steps.crops) != len(self.members):
            return None
        h, w = steps.header.height, steps.header.width
        whole = []
        for member, crop in zip(self.members, steps.crops):
            if crop is None:
                return None
            whole.append(member.whole(crop, h, w))
        return regional(tuple(whole), h, w)

    def draw_flips(self, rng: np.random.Generator) -> tuple[bool, ...]:
        """Each view's flip, in view order after every view's crop: MultiView's order of draws."""
        return tuple(m.draw_flip(rng) for m in self.members)


#: What GPU decode runs: one pipeline, or a MultiView's.
GpuRunnable = Union[GpuPipeline, GpuViews]
