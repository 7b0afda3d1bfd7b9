"""uint8 HWC → uint8 HWC transforms, planned from the JPEG header where they can be.

The first transform of a pipeline may be a *crop planner* (RandomResizedCrop, Resize,
Resize + CenterCrop): it chooses its crop from the header size alone, so the decode can
be planned for it: full, at a DCT scale, or only the crop's region, whichever costs
least on this machine within the antialiased tolerance (:mod:`fastload.decode.plan`).
Resizing is antialiased
bilinear by default, as in torchvision v2; ``antialias=False`` trades that for speed.
Randomness comes from the ``rng`` passed in, which the datasets derive from
(seed, epoch, sample index): output never depends on which worker ran a sample.

Your own transforms: ``f(img, rng) -> img`` (reproducible: draw only from ``rng``), or
``f(img) -> img`` (called as is; its randomness comes from global generators, seeded
per worker, so it is not reproducible per sample). albumentations: :func:`albumentations`.
"""

from __future__ import annotations

import copy
import inspect
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from .decode import Decoder, ImageHeader, check_pixels, read_header
from .decode.plan import DecodePlan, choose, execute
from .resize import Crop, resize  # noqa: F401  (resize: re-exported)

__all__ = [
    "CenterCrop",
    "Compose",
    "Crop",
    "DecodeSteps",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ResizedCenterCrop",
    "albumentations",
    "eval",
    "takes_rng",
    "train",
]


def _pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (tuple, list)) else ()
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in pair):
        raise ValueError(f"{what} must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


class CropPlanner:
    """A transform whose geometry is chosen from the image size alone."""

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        raise NotImplementedError

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = img.shape[:2]
        return self.plan(h, w, rng).apply(img, h, w)


class RandomResizedCrop(CropPlanner):
    """torchvision's RandomResizedCrop: 10 tries at a random area and aspect ratio, then
    a centre crop clamped to ``ratio``.

    Args:
        size: Output size, an int or (height, width).
        scale: Range of the crop's area as a fraction of the image's.
        ratio: Range of the crop's aspect ratio (width / height), sampled log-uniformly.
        antialias: Antialiased bilinear resize, as torchvision v2 (False: OpenCV's
            bilinear, faster but aliased when shrinking; see :func:`fastload.resize.resize`).
    """

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), antialias: bool = True) -> None:
        self.size = _pair(size, "size")
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"scale must be (min, max) with 0 < min <= max, got {scale!r}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (min, max) with 0 < min <= max, got {ratio!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self._log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.antialias = bool(antialias)

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        area = h * w
        (s0, s1), (r0, r1) = self.scale, self._log_ratio
        for _ in range(10):
            # One draw of 4 uniforms per try (area, ratio, top, left): numpy's per-call
            # overhead made 4 separate draws ~3x slower, a few % of a sample's time.
            u_area, u_ratio, u_top, u_left = rng.random(4).tolist()
            target = area * (s0 + (s1 - s0) * u_area)
            aspect = math.exp(r0 + (r1 - r0) * u_ratio)
            cw = int(round(math.sqrt(target * aspect)))
            ch = int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                top = int(u_top * (h - ch + 1))
                left = int(u_left * (w - cw + 1))
                return Crop(top, left, ch, cw, *self.size, self.antialias)
        in_ratio = w / h
        if in_ratio < self.ratio[0]:
            cw, ch = w, int(round(w / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            ch, cw = h, int(round(h * self.ratio[1]))
        else:
            ch, cw = h, w
        return Crop((h - ch) // 2, (w - cw) // 2, ch, cw, *self.size, self.antialias)

    def __repr__(self) -> str:
        return (f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
                f"antialias={self.antialias})")


class Resize(CropPlanner):
    """Resizes the shorter side to ``size``, keeping the aspect ratio (torchvision's
    int truncation of the longer side); antialiased unless ``antialias=False``."""

    def __init__(self, size: int, antialias: bool = True) -> None:
        self.size = _pair(size, "size")[0]
        self.antialias = bool(antialias)

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        if h <= w:
            return self.size, max(1, int(self.size * w / h))
        return max(1, int(self.size * h / w)), self.size

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        return Crop(0, 0, h, w, *self.out_size(h, w), self.antialias, window=True)

    def __repr__(self) -> str:
        return f"Resize({self.size}, antialias={self.antialias})"


class CenterCrop:
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
        self.resize = Resize(resize, antialias)
        self.antialias = self.resize.antialias
        if max(self.size) > self.resize.size:
            raise ValueError(f"crop {self.size} is larger than the resize {resize}")

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop:
        rh, rw = self.resize.out_size(h, w)
        sy, sx = h / rh, w / rw
        ch, cw = self.size
        top, left = int(round((rh - ch) / 2)), int(round((rw - cw) / 2))
        return Crop(top * sy, left * sx, ch * sy, cw * sx, ch, cw, self.antialias, window=True)

    def __repr__(self) -> str:
        return f"ResizedCenterCrop(size={self.size}, resize={self.resize.size}, antialias={self.antialias})"


class RandomHorizontalFlip:
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


def takes_rng(transform: Any) -> bool:
    """Whether ``transform`` is called ``f(img, rng)`` (it takes two positional arguments)
    rather than ``f(img)``. Callables whose signature cannot be read are ``f(img)``."""
    try:
        params = inspect.signature(transform).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _check_transform(t: Any) -> None:
    if not callable(t):
        raise TypeError(f"transform {t!r} is not callable")
    if type(t).__module__.split(".")[0] == "albumentations":
        raise TypeError(f"{type(t).__name__} is an albumentations transform, called with keywords: wrap it as "
                        "fl.transforms.albumentations(aug)")


@dataclass(frozen=True)
class DecodeSteps:
    """What :meth:`Compose.plan_decode` decided for one encoded image.

    Attributes:
        header: The image's header.
        crop: The leading crop planner's crop, or None (no crop planner: full decode).
        plan: The cost planner's decode plan (TurboJPEG JPEGs), or None (the decoder
            picks its own power-of-2 scale).
    """

    header: ImageHeader
    crop: Crop | None
    plan: DecodePlan | None

    @property
    def region(self) -> tuple[int, int, int, int] | None:
        """(y0, x0, y1, x1) of a planned region decode, else None."""
        return self.plan.region if self.plan is not None else None


class Compose:
    """Applies transforms in order; each is ``f(img, rng) -> img`` or ``f(img) -> img``.

    A leading Resize + CenterCrop is fused into one ResizedCenterCrop. Which form a
    transform takes is read once from its signature (:func:`takes_rng`).

    Args:
        transforms: Callables on H×W×C uint8 arrays; the first may be a crop planner.
        reduced_decode: Let a leading crop planner decode JPEGs at a reduced DCT scale
            (faster; pixels differ from a full decode by the decoder's filtering).
    """

    def __init__(self, transforms: Sequence, reduced_decode: bool = True) -> None:
        ts = list(transforms)
        for t in ts:
            _check_transform(t)
        if len(ts) >= 2 and isinstance(ts[0], Resize) and isinstance(ts[1], CenterCrop):
            ts[:2] = [ResizedCenterCrop(ts[1].size, ts[0].size, ts[0].antialias)]
        self.transforms = ts
        self.reduced_decode = reduced_decode
        self._with_rng = [takes_rng(t) for t in ts]

    @staticmethod
    def _apply(t: Any, with_rng: bool, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return t(img, rng) if with_rng else t(img)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        for t, with_rng in zip(self.transforms, self._with_rng):
            img = self._apply(t, with_rng, img, rng)
        return img

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop | None:
        """The leading crop planner's plan, or None if the pipeline has none."""
        if self.transforms and isinstance(self.transforms[0], CropPlanner):
            return self.transforms[0].plan(h, w, rng)
        return None

    def plan_decode(self, data, decoder: Decoder, rng: np.random.Generator, max_pixels: int | None = None,
                    region_ok: bool = False) -> DecodeSteps:
        """The first half of :meth:`decode`: the header read and checked against the pixel
        limit, the leading crop drawn from ``rng`` and, for TurboJPEG, the decode planned.

        Args:
            data: The encoded image.
            decoder: The decoder :meth:`finish_decode` will use.
            rng: The sample's generator; the crop draws from it, later transforms go on.
            max_pixels: Pixel limit (None: ``fastload.decode.MAX_IMAGE_PIXELS``).
            region_ok: Allow a region decode: only for a sample known to decode cleanly (a
                region decode cannot see libjpeg's corrupt-data warnings), so off by default.
        """
        header = read_header(data)
        check_pixels(header, max_pixels)
        crop = self.plan(header.height, header.width, rng)
        planned = None
        if crop is not None and getattr(decoder, "scales", None) and header.format == "jpeg" and header.components != 4:
            planned = choose(header, crop, self.reduced_decode, region_ok)
        return DecodeSteps(header, crop, planned)

    def finish_decode(self, data, decoder: Decoder, steps: DecodeSteps, rng: np.random.Generator,
                      out: np.ndarray | None = None, max_pixels: int | None = None,
                      pixels: np.ndarray | None = None) -> np.ndarray:
        """The second half of :meth:`decode`: decode as ``steps`` planned (``pixels``: the
        planned region, already decoded by a batched call), resize and the later transforms."""
        header, crop, planned = steps.header, steps.crop, steps.plan
        h, w = header.height, header.width
        if crop is None:
            img = decoder.decode(data, header=header, max_pixels=max_pixels)
        else:
            direct = out is not None and out.shape == (crop.out_h, crop.out_w, 3)
            if planned is not None:
                if pixels is not None:  # the planned region, decoded by a batched call
                    img = crop.apply(pixels, h, w, out if direct else None, float(planned.scale), planned.origin)
                else:
                    img = execute(planned, data, decoder, header, crop, out if direct else None, max_pixels)
            else:
                img = decoder.decode(data, crop.decode_scale if self.reduced_decode else 1.0, header=header,
                                     max_pixels=max_pixels)
                direct = direct and img.shape[2] == 3
                img = crop.apply(img, h, w, out if direct else None)
        first = 1 if crop is not None else 0
        for t, with_rng in zip(self.transforms[first:], self._with_rng[first:]):
            inplace = getattr(t, "apply_inplace", None)
            img = inplace(img, rng) if inplace is not None and img is out else self._apply(t, with_rng, img, rng)
        return img

    def decode(self, data, decoder: Decoder, rng: np.random.Generator, out: np.ndarray | None = None,
               max_pixels: int | None = None, *, region_ok: bool = False) -> np.ndarray:
        """Decodes ``data`` as the leading crop's cheapest plan allows and transforms it.

        The header is read once, checked against the pixel limit (``max_pixels``, else
        ``fastload.decode.MAX_IMAGE_PIXELS``) and handed to the decoder. With TurboJPEG,
        :mod:`fastload.decode.plan` picks a full, DCT-scaled or region decode by measured
        cost (DCT scales only with ``reduced_decode``; a region only with ``region_ok``, for
        a sample known to decode cleanly);
        other decoders get the smallest power-of-2 scale the crop allows. With ``out`` (a
        batch slot of the output's shape), the leading crop resizes straight into it and
        in-place transforms keep it there; the result is ``out`` whenever that was
        possible, else a separate array the caller must copy. :meth:`plan_decode` and
        :meth:`finish_decode` are its two halves, for batched decodes in between.
        """
        steps = self.plan_decode(data, decoder, rng, max_pixels, region_ok)
        return self.finish_decode(data, decoder, steps, rng, out, max_pixels)

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(map(repr, self.transforms)) + "])"


class Albumentations:
    """An albumentations pipeline as an ``f(img, rng)`` transform.

    Each call hands the pipeline generators drawn from ``rng`` (albumentations >= 2's
    ``set_random_state``), so its draws too depend only on (seed, epoch, index). Each
    thread uses its own copy of the pipeline.

    Args:
        aug: e.g. ``A.Compose([...])``, called as ``aug(image=img)[key]``.
        key: The output key of the image.
    """

    def __init__(self, aug: Any, key: str = "image") -> None:
        if not callable(aug):
            raise TypeError(f"{aug!r} is not callable")
        self.aug, self.key = aug, key
        self._local = threading.local()

    def _pipeline(self) -> Any:
        aug = getattr(self._local, "aug", None)
        if aug is None:
            aug = self._local.aug = copy.deepcopy(self.aug)
        return aug

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        aug = self._pipeline()
        seed_with = getattr(aug, "set_random_state", None)
        if seed_with is not None:
            seed_with(np.random.default_rng(rng.integers(2**63)), random.Random(int(rng.integers(2**63))))
        return aug(image=np.ascontiguousarray(img))[self.key]

    def __getstate__(self) -> dict:
        return {"aug": self.aug, "key": self.key}

    def __setstate__(self, state: dict) -> None:
        self.aug, self.key = state["aug"], state["key"]
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"albumentations({self.aug!r})"


def albumentations(aug: Any, key: str = "image") -> Albumentations:
    """``fl.transforms.albumentations(A.Compose([...]))``: an albumentations pipeline as a
    fastload transform, reproducible per (seed, epoch, index) (see :class:`Albumentations`)."""
    return Albumentations(aug, key)


def as_compose(transform) -> Compose:
    """Wraps a transform (or None) so datasets always hold a Compose."""
    if transform is None:
        return Compose([])
    if isinstance(transform, Compose):
        return transform
    if isinstance(transform, (list, tuple)):
        return Compose(transform)
    return Compose([transform])


def train(size: int = 224, scale: Sequence[float] = (0.08, 1.0), flip: bool = True,
          reduced_decode: bool = True, antialias: bool = True) -> Compose:
    """RandomResizedCrop(size, scale) and a random horizontal flip (antialiased unless
    ``antialias=False``, the faster OpenCV bilinear)."""
    ts: list = [RandomResizedCrop(size, scale=scale, antialias=antialias)]
    if flip:
        ts.append(RandomHorizontalFlip())
    return Compose(ts, reduced_decode)


def eval(size: int = 224, resize: int | None = None, reduced_decode: bool = True,  # noqa: A001
         antialias: bool = True) -> Compose:
    """Resize the shorter side to ``resize`` (default size / 0.875), then centre-crop ``size``.

    Antialiased, it matches torchvision's Resize + CenterCrop on PIL images to within
    rounding; ``antialias=False`` is the faster OpenCV bilinear.
    """
    size_hw = _pair(size, "size")
    crop = ResizedCenterCrop(size_hw, resize or int(round(max(size_hw) / 0.875)), antialias)
    return Compose([crop], reduced_decode)
