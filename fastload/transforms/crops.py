"""Crop planners and the flip: the leading, header-planned part of a pipeline."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import cv2
import numpy as np

from ..decode.resize import Crop, random_resized_crop, resized_center_crop, shorter_side
from .functional._utils import finite
from .settings import Settings


def _pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    pair = (
        (size, size)
        if isinstance(size, (int, np.integer))
        else tuple(size)
        if isinstance(size, (tuple, list, np.ndarray))
        else ()
    )
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in pair):
        raise ValueError(f"{what} must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


class InPlace(Settings, abc.ABC):
    """A transform that can also write its result into the array it is given: :class:`Compose`
    runs :meth:`apply_inplace` on an array nothing else holds (a fresh decode, a batch slot),
    ``__call__`` elsewhere. Subclassed by fastload's flips; a user's transform is not one."""

    @abc.abstractmethod
    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...

    @abc.abstractmethod
    def apply_inplace(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Same draws as ``__call__``, the result written into ``img`` (and returned)."""


class CropPlanner(Settings):
    """A transform whose geometry is chosen from the image size alone."""

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        raise NotImplementedError

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = img.shape[:2]
        if img.ndim == 2:  # grayscale H×W, as the other transforms take it: resized as H×W×1
            return self.plan(h, w, rng).apply(img[..., None], h, w)[..., 0]
        return self.plan(h, w, rng).apply(img, h, w)


class RandomResizedCrop(CropPlanner):
    """torchvision's RandomResizedCrop: 10 tries at a random area and aspect ratio, then
    a centre crop clamped to ``ratio``.

    Args:
        size: Output size, an int or (height, width).
        scale: Range of the crop's area as a fraction of the image's.
        ratio: Range of the crop's aspect ratio (width / height), sampled log-uniformly.
        antialias: Antialiased bilinear resize, as torchvision v2 (False: OpenCV's
            bilinear, faster but aliased when shrinking; see :func:`fastload.decode.resize.resize`).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        antialias: bool = True,
    ) -> None:
        self.size = _pair(size, "size")
        finite("scale", tuple(scale))
        finite("ratio", tuple(ratio))
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"scale must be (min, max) with 0 < min <= max, got {scale!r}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (min, max) with 0 < min <= max, got {ratio!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.antialias = bool(antialias)

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        return random_resized_crop(h, w, self.size, self.scale, self.ratio, rng, self.antialias)

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, antialias={self.antialias})"
        )


class Resize(CropPlanner):
    """torchvision's ``Resize``: an int (or a one-element list) resizes the shorter side to
    ``size``, keeping the aspect ratio (torchvision's int truncation of the longer side); a
    (height, width) pair resizes to exactly that size. Antialiased unless ``antialias=False``.
    """

    def __init__(self, size: int | Sequence[int], antialias: bool = True) -> None:
        if isinstance(size, (list, tuple, np.ndarray)) and len(size) == 1:
            size = size[0]
        pair = _pair(size, "size")  # checks it
        self.size: int | tuple[int, int] = pair[0] if isinstance(size, (int, np.integer)) else pair
        self.antialias = bool(antialias)

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        if isinstance(self.size, tuple):
            return self.size
        return shorter_side(h, w, self.size)

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        return Crop(0, 0, h, w, *self.out_size(h, w), self.antialias, window=True)

    def __repr__(self) -> str:
        return f"Resize({self.size}, antialias={self.antialias})"


class CenterCrop(Settings):
    """Crops the centre ``size`` (torchvision's rounding); the image must be at least that big."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size, "size")

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        h, w = img.shape[:2]
        ch, cw = self.size
        if ch > h or cw > w:
            raise ValueError(f"CenterCrop{self.size} is larger than the {h}x{w} image")
        top, left = int(round((h - ch) / 2)), int(round((w - cw) / 2))
        return img[top : top + ch, left : left + cw]

    def __repr__(self) -> str:
        return f"CenterCrop({self.size})"


class ResizedCenterCrop(CropPlanner):
    """Resize(resize) followed by CenterCrop(size) as one crop of the full image, so the
    decode can be reduced and only the kept pixels are resized. Antialiased (the
    default), its pixels are those of Pillow's resize then centre crop."""

    def __init__(self, size: int | Sequence[int], resize: int, antialias: bool = True) -> None:
        self.size = _pair(size, "size")
        if isinstance(resize, bool) or not isinstance(resize, (int, np.integer)) or resize <= 0:
            raise ValueError(f"resize must be a positive int (the shorter side), got {resize!r}")
        self.resize = int(resize)  # the shorter side, as given (kept under its name: see settings.py)
        self.antialias = bool(antialias)
        if max(self.size) > self.resize:
            raise ValueError(f"crop {self.size} is larger than the resize {resize}")

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        """The size an h×w image is resized to before the centre crop."""
        return shorter_side(h, w, self.resize)

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        return resized_center_crop(h, w, self.size, self.resize, self.antialias)

    def __repr__(self) -> str:
        return f"ResizedCenterCrop(size={self.size}, resize={self.resize}, antialias={self.antialias})"


class RandomHorizontalFlip(InPlace):
    """Flips left-right with probability ``p`` (a view: no copy until collate)."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p = p

    def draw(self, rng: np.random.Generator) -> bool:
        """Whether this sample is flipped: the one draw ``__call__`` makes."""
        return rng.random() < self.p

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return img[:, ::-1] if self.draw(rng) else img

    def apply_inplace(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Same draw as ``__call__``, flipping ``img`` in place (for a batch slot)."""
        if self.draw(rng):
            cv2.flip(img, 1, dst=img)
        return img

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"
