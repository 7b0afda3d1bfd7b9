"""A pipeline of transforms whose leading crop plans the decode (see the package docstring)."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..decode import Decoder, ImageHeader, check_pixels, read_header
from ..decode.plan import DecodePlan, choose, execute
from ..decode.resize import Crop
from .crops import CenterCrop, CropPlanner, InPlace, Resize, ResizedCenterCrop
from .foreign import foreign_error
from .settings import Settings, same_items


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
    foreign = foreign_error(t)
    if foreign is not None:
        raise TypeError(foreign)
    if type(t).__module__.split(".")[0] == "albumentations":
        raise TypeError(
            f"{type(t).__name__} is an albumentations transform, called with keywords: wrap it as "
            "fl.transforms.albumentations(aug)"
        )


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


_REQUIRED: Any = object()  # Compose.__call__'s rng when the caller gave none


class DecodePipeline(Settings, abc.ABC):
    """What a dataset holds as its transform (:func:`as_compose`): transforms that plan the
    decode of an encoded image from its header (:meth:`plan_decode`), then decode it and
    transform the result (:meth:`finish_decode`). Subclassed by :class:`Compose` (one view)
    and :class:`~fastload.transforms.MultiView` (several) only; any other transform is
    wrapped in a Compose.

    Attributes:
        transforms: What the pipeline runs: a Compose's transforms, a MultiView's pipelines
            (empty: the decoded image as it is).
    """

    transforms: Sequence[Any]

    @abc.abstractmethod
    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> Any:
        """The pipeline on an already decoded image."""

    @abc.abstractmethod
    def plan_decode(
        self,
        data: Any,
        decoder: Decoder,
        rng: np.random.Generator,
        max_pixels: int | None = None,
        *,
        verified: bool = False,
    ) -> Any:
        """The header read and checked, the crops drawn from ``rng`` and the decode planned:
        the steps :meth:`finish_decode` takes."""

    @abc.abstractmethod
    def finish_decode(
        self,
        data: Any,
        decoder: Decoder,
        steps: Any,
        rng: np.random.Generator,
        out: Any = None,
        max_pixels: int | None = None,
        pixels: np.ndarray | None = None,
    ) -> Any:
        """``data`` decoded as ``steps`` planned and transformed (into ``out`` where it can)."""


class Compose(DecodePipeline):
    """Applies transforms in order; each is ``f(img, rng) -> img`` or ``f(img) -> img``.

    A leading Resize + CenterCrop is fused into one ResizedCenterCrop. Which form a
    transform takes is read once from its signature (:func:`takes_rng`).

    Args:
        transforms: Callables on H×W×C uint8 arrays; the first may be a crop planner.
        reduced_decode: Let a leading crop planner decode JPEGs at a reduced DCT scale
            (faster; pixels differ from a full decode by the decoder's filtering).
    """

    def __init__(self, transforms: Sequence, reduced_decode: bool = True) -> None:
        if callable(transforms) and not isinstance(transforms, (list, tuple)):
            raise TypeError(f"Compose takes a list of transforms, got {transforms!r}: write Compose([t])")
        ts = list(transforms)
        for t in ts:
            _check_transform(t)
        if len(ts) >= 2 and isinstance(ts[0], Resize) and isinstance(ts[0].size, int) and isinstance(ts[1], CenterCrop):
            ts[:2] = [ResizedCenterCrop(ts[1].size, ts[0].size, ts[0].antialias)]
        self.transforms = ts
        self.reduced_decode = reduced_decode
        self._steps: tuple[tuple, list[bool], list[bool]] = ((), [], [])
        self._forms()

    def _forms(self) -> tuple[tuple, list[bool], list[bool]]:
        """The transforms, whether each takes the rng and whether it may run in place
        (after_crop): read from the transforms, again where the list was changed in place (a
        transform replaced, added or removed: ``pipeline.transforms[0] = t``). One tuple,
        replaced whole: a thread running the pipeline meanwhile sees the old or the new."""
        ts = self.transforms
        if not same_items(self._steps[0], ts):
            for t in ts:
                _check_transform(t)
            self._steps = (tuple(ts), [takes_rng(t) for t in ts], [isinstance(t, InPlace) for t in ts])
        return self._steps

    @staticmethod
    def _apply(t: Any, with_rng: bool, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return t(img, rng) if with_rng else t(img)

    def __call__(self, img: np.ndarray, rng: Any = _REQUIRED) -> np.ndarray:
        # rng is required (None is fine for a pipeline that draws nothing); the default only
        # lets a missing one say what to do: t(img) is a torchvision habit, often in a
        # Dataset's __getitem__, where fastload cannot hand over the sample's rng.
        if rng is _REQUIRED:
            raise TypeError(
                "Compose is called as t(img, rng), rng a numpy Generator (e.g. np.random.default_rng(0)); "
                "in a Dataset of your own, give the transforms to fl.WrappedDataset(dataset, "
                "transform=[...]), which calls them with each sample's rng"
            )
        if not isinstance(img, np.ndarray):
            raise TypeError(
                f"Compose takes the image as a uint8 H×W×C numpy array, got {type(img).__name__} "
                "(a PIL image: np.asarray(img))"
            )
        ts, with_rng, _ = self._forms()
        for t, takes in zip(ts, with_rng):
            img = self._apply(t, takes, img, rng)
        return img

    def plan(self, h: int, w: int, rng: np.random.Generator) -> Crop | None:
        """The leading crop planner's plan, or None if the pipeline has none."""
        if self.transforms and isinstance(self.transforms[0], CropPlanner):
            return self.transforms[0].plan(h, w, rng)
        return None

    def plan_decode(
        self,
        data,
        decoder: Decoder,
        rng: np.random.Generator,
        max_pixels: int | None = None,
        *,
        verified: bool = False,
    ) -> DecodeSteps:
        """The first half of :meth:`decode`: the header read and checked against the pixel
        limit, the leading crop drawn from ``rng`` and, for TurboJPEG, the decode planned.

        Args:
            data: The encoded image.
            decoder: The decoder :meth:`finish_decode` will use.
            rng: The sample's generator; the crop draws from it, later transforms go on.
            max_pixels: Pixel limit (None: ``fastload.decode.MAX_IMAGE_PIXELS``).
            verified: ``data`` was verified strictly before (its checksum matched): the
                cheapest plan may be one that cannot see damage (a region decode).
        """
        header = read_header(data)
        check_pixels(header, max_pixels)
        crop = self.plan(header.height, header.width, rng)
        planned = None
        if crop is not None and decoder.scales and header.format == "jpeg" and header.components != 4:
            planned = choose(header, (crop,), self.reduced_decode, verified)
        return DecodeSteps(header, crop, planned)

    def finish_decode(
        self,
        data,
        decoder: Decoder,
        steps: DecodeSteps,
        rng: np.random.Generator,
        out: np.ndarray | None = None,
        max_pixels: int | None = None,
        pixels: np.ndarray | None = None,
    ) -> np.ndarray:
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
                img = decoder.decode(
                    data, crop.decode_scale if self.reduced_decode else 1.0, header=header, max_pixels=max_pixels
                )
                direct = direct and img.shape[2] == 3
                img = crop.apply(img, h, w, out if direct else None)
        # Decoded here for this sample alone (never the thread's scratch buffer: execute copies
        # out of it), so in-place transforms may write to it; a batched region (pixels) may not
        # be, nor a read-only array (Pillow's).
        owned = pixels is None and img.flags.writeable
        return self.after_crop(img, rng, out, crop is not None, owned)

    def after_crop(
        self,
        img: np.ndarray,
        rng: np.random.Generator,
        out: np.ndarray | None = None,
        cropped: bool = True,
        owned: bool = False,
    ) -> np.ndarray:
        """The transforms after the leading crop planner (all of them unless ``cropped``) on
        ``img``; in-place ones keep ``out`` there when ``img`` is ``out``, and run in place on
        ``img`` when it is ``owned`` (nothing else holds it): a flip then costs a few µs,
        where a flipped view costs its caller a reversed copy (~100 µs for 224x224 RGB)."""
        first = 1 if cropped else 0
        ts, with_rng, inplace = self._forms()
        steps = zip(ts[first:], with_rng[first:], inplace[first:])
        for t, takes, in_place in steps:
            if in_place and (owned or img is out):
                img = t.apply_inplace(img, rng)
            else:
                img = self._apply(t, takes, img, rng)
                owned = False  # the result may be a view of an array someone else holds
        return img

    def decode(
        self,
        data,
        decoder: Decoder,
        rng: np.random.Generator,
        out: np.ndarray | None = None,
        max_pixels: int | None = None,
    ) -> np.ndarray:
        """Decodes ``data`` as the leading crop's cheapest plan allows and transforms it.

        The header is read once, checked against the pixel limit (``max_pixels``, else
        ``fastload.decode.MAX_IMAGE_PIXELS``) and handed to the decoder. With TurboJPEG,
        :mod:`fastload.decode.plan` picks a full or DCT-scaled decode by measured cost (DCT
        scales only with ``reduced_decode``; every plan as strict as the full decode);
        other decoders get the smallest power-of-2 scale the crop allows. With ``out`` (a
        batch slot of the output's shape), the leading crop resizes straight into it and
        in-place transforms keep it there; the result is ``out`` whenever that was
        possible, else a separate array the caller must copy. :meth:`plan_decode` and
        :meth:`finish_decode` are its two halves, for batched decodes in between.
        """
        steps = self.plan_decode(data, decoder, rng, max_pixels)
        return self.finish_decode(data, decoder, steps, rng, out, max_pixels)

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(map(repr, self.transforms)) + "])"


def as_compose(transform: Any) -> DecodePipeline:
    """Wraps a transform (or None) so datasets always hold a Compose, or a pipeline that plans
    its decode as a Compose does (a :class:`DecodePipeline`: a
    :class:`~fastload.transforms.MultiView`), which is kept as it is."""
    if isinstance(transform, DecodePipeline):
        return transform
    return compose_of(transform)


def compose_of(transform: Any) -> Compose:
    """``transform`` as one view's pipeline: a Compose as it is, ``Compose(transform)`` for a
    list, ``Compose([])`` for None, else ``Compose([transform])``."""
    if transform is None:
        return Compose([])
    if isinstance(transform, Compose):
        return transform
    if isinstance(transform, (list, tuple)):
        return Compose(transform)
    return Compose([transform])
