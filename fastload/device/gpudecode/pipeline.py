"""Which transform pipelines GPU decode runs, and each sample's geometry there.

GPU decode runs the presets (:func:`fastload.transforms.train` and :func:`~fastload.transforms.eval`):
RandomResizedCrop or Resize + CenterCrop, antialiased, optionally followed by
RandomHorizontalFlip. Their crops are drawn in the worker from the sample's generator,
exactly as the CPU path draws them; the GPU then crops, resizes and flips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ...decode.resize import Crop
from ...transforms import RandomHorizontalFlip, RandomResizedCrop, ResizedCenterCrop

#: A RandomResizedCrop box covering less than this share of the image is decoded as a
#: region (nvJPEG and libjpeg-turbo decode only the rows, and columns, it needs); larger
#: boxes are decoded whole.
REGION_MAX_AREA = 0.5

CropPlanner = Union[RandomResizedCrop, ResizedCenterCrop]

_USE_CPU = "use decode='cpu' for other transforms"


@dataclass(frozen=True)
class Geometry:
    """How GPU decode turns one decoded image into its batch row.

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


@dataclass(frozen=True)
class GpuPipeline:
    """The transforms of a dataset, as GPU decode runs them.

    Attributes:
        crop: The leading crop planner.
        flip: The random flip after it, or None.
        out_size: (height, width) of every output image.
    """

    crop: CropPlanner
    flip: RandomHorizontalFlip | None
    out_size: tuple[int, int]

    @classmethod
    def of(cls, dataset: Any) -> GpuPipeline:
        """The GPU form of ``dataset.transform``.

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
        ts = list(dataset.transform.transforms)
        if not ts or not isinstance(ts[0], (RandomResizedCrop, ResizedCenterCrop)):
            raise ValueError(
                f"decode='gpu' runs RandomResizedCrop or Resize + CenterCrop first "
                f"(fl.transforms.train() / eval()), got {dataset.transform!r}; {_USE_CPU}"
            )
        crop = ts[0]
        if not crop.antialias:
            raise ValueError(
                f"decode='gpu' resizes with antialiasing only, got {crop!r}; use antialias=True or decode='cpu'"
            )
        rest = ts[1:]
        if len(rest) > 1 or (rest and not isinstance(rest[0], RandomHorizontalFlip)):
            raise ValueError(
                f"decode='gpu' runs at most a RandomHorizontalFlip after the crop, got "
                f"{dataset.transform!r}; {_USE_CPU}"
            )
        return cls(crop, rest[0] if rest else None, crop.size)

    def geometry(self, crop: Crop, height: int, width: int) -> Geometry:
        """GPU decode's work for ``crop`` (drawn by :attr:`crop`) of a ``height`` x ``width`` image."""
        if isinstance(self.crop, ResizedCenterCrop):
            # Resize the whole image, then take the centre window: the CPU path's pixels
            # (its window resize computes exactly these output pixels).
            rh, rw = self.crop.resize.out_size(height, width)
            ch, cw = self.crop.size
            return Geometry(
                None, (0, 0, height, width), (rh, rw), (int(round((rh - ch) / 2)), int(round((rw - cw) / 2)))
            )
        # RandomResizedCrop: whole pixels, as Crop.apply cuts them from a full-size decode.
        y0, x0 = min(int(round(crop.top)), height - 1), min(int(round(crop.left)), width - 1)
        y1 = max(min(int(round(crop.top + crop.height)), height), y0 + 1)
        x1 = max(min(int(round(crop.left + crop.width)), width), x0 + 1)
        out = (crop.out_h, crop.out_w)
        if (y1 - y0) * (x1 - x0) < REGION_MAX_AREA * height * width:
            return Geometry((y0, x0, y1, x1), (0, 0, y1 - y0, x1 - x0), out, (0, 0))
        return Geometry(None, (y0, x0, y1, x1), out, (0, 0))
