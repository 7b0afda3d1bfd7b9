"""Decode plans chosen by measured cost: full decode, a DCT scale, or a region decode.

For each sample whose transform starts with a crop, :meth:`Planner.choose` prices every
way to get the crop's pixels, the resize after it included, and takes the cheapest that
stays within the antialiased reference's tolerance, when it is predicted at least
:data:`MARGIN` cheaper than the full decode (else the full decode: nothing is planned
that the calibration cannot tell apart from it):

* a full decode;
* a full decode with fast chroma upsampling (libjpeg's replication instead of its
  triangle filter; 0.3 levels of 255 from the reference after the resize, worst image
  1.5), for random crops (not for eval windows);
* a DCT-scaled decode at n/8 (libjpeg-turbo), when the crop is still at least
  :data:`MIN_RATIO` times its output size at that scale and the resize can start on
  the crop's exact phase (:func:`fastload.decode.resize.phase_error`);
* a region decode (:mod:`fastload.decode.roi`): the crop's pixels of a full-size decode,
  only for a sample whose bytes were verified strictly before (``verified=True`` to
  :meth:`Planner.choose`: their CRC32C matched a ``fastload verify`` manifest or a
  converter's record, :mod:`fastload.verified`). nvImageCodec's region decode fails on
  none of libjpeg's corrupt-data warnings and never reads the data below the crop, so it
  lets through damage that every other plan refuses (``benchmarks/bench_damage.py``
  measures it); for bytes not verified it is never planned, and every plan detects what
  the full strict decode detects: libjpeg-turbo entropy-decodes every block at any DCT
  scale and fails on its warnings. Where it replaces a DCT-scaled or fast-upsampled plan
  the pixels differ from the unverified decode's by that plan's filtering (measured in
  ``docs/guides/transforms.md``). ``FASTLOAD_ROI=trusted`` (deprecated) treats every
  sample as verified.

Costs are linear models (µs) of the bytes and pixels each plan decodes and resizes,
fitted per plan by :func:`fastload.decode.costs.calibrate` on photographs, end to end
(decode into the thread's scratch buffer, then crop and resize into the batch slot, as
:func:`execute` runs it), and cached in ``~/.cache/fastload/`` keyed by the library
versions and CPU model. Every process on a machine reads the same cache (the first one
to need it calibrates under a file lock, the others wait), so the plan of a sample, and
so its pixels, never depends on which worker or process decoded it.
``FASTLOAD_NO_CALIBRATION=1`` uses the built-in ``costs.DEFAULT_COSTS`` instead.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from . import roi
from ._base import check_pixels
from .costs import (
    DEFAULT_COSTS,
    SCALE_KEYS,
    calibration_disabled,
    decode_features,
    load_or_calibrate,
    region_box,
    resize_features,
)
from .header import ImageHeader, check_jpeg_complete
from .libjpeg import scaled_size, scratch
from .resize import PHASE_TOL, Crop, phase_error
from .turbo import TurboJPEGDecoder

#: A DCT-scaled decode is used only when the crop keeps at least this many decoded
#: pixels per output pixel (on each side). Measured on real photos against Pillow's
#: antialiased resize of the full-size crop, with the exact-phase resize: at 1.25-1.5
#: per-image error mean 0.7-1.2, worst 2.9 levels of 255 (1/4 to 7/8 scales); at 1.0-1.25
#: the 1/4 scale averages 1.6, over the 1.5 tolerance.
MIN_RATIO = 1.25

#: Another plan replaces the full decode only when predicted at least this much cheaper:
#: the calibration's own spread on a shared machine is a few per cent.
MARGIN = 0.05

_ONE = Fraction(1)


@dataclass(frozen=True)
class DecodePlan:
    """How one sample is decoded.

    Attributes:
        scale: DCT scale of the decode (1: full size).
        region: (y0, x0, y1, x1) in full-size pixels for a region decode, else None.
        cost: Predicted µs for the decode and the resize after it.
        fast_upsample: Chroma upsampled by replication (a full-size decode).
    """

    scale: Fraction = _ONE
    region: tuple[int, int, int, int] | None = None
    cost: float = 0.0
    fast_upsample: bool = False

    @property
    def kind(self) -> str:
        """ "full", "full, fast upsampling", "region" or "scale n/8": for counting plans."""
        if self.region is not None:
            return "region"
        if self.fast_upsample:
            return "full, fast upsampling"
        return "full" if self.scale == 1 else f"scale {self.scale.numerator * 8 // self.scale.denominator}/8"

    @property
    def key(self) -> str:
        """The plan's cost model in :data:`fastload.decode.costs.DEFAULT_COSTS` ``["plans"]``."""
        if self.region is not None:
            return "region"
        if self.fast_upsample:
            return "fast"
        return "full" if self.scale == 1 else f"{self.scale.numerator * 8 // self.scale.denominator}/8"

    @property
    def origin(self) -> tuple[int, int]:
        """Where the decoded pixels start in the full-size image."""
        return (self.region[0], self.region[1]) if self.region is not None else (0, 0)

    def decode(
        self, data: Any, decoder: Any, header: ImageHeader, max_pixels: int | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """The planned pixels: ``decoder`` (a libjpeg-turbo backend) at ``scale``, into
        ``out`` when given (a flat uint8 buffer large enough), or the region decoder."""
        if self.region is None:
            return decoder.decode(
                data, header=header, max_pixels=max_pixels, scale=self.scale, fast_upsample=self.fast_upsample, out=out
            )
        check_jpeg_complete(data)
        return roi.get_region_decoder().decode(data, *self.region)


def plan_for_key(key: str, header: ImageHeader, crop: Crop, cost: float = 0.0) -> DecodePlan:
    """The plan that cost model ``key`` prices, for ``crop`` of the image with ``header``."""
    if key == "full":
        return DecodePlan(_ONE, None, cost)
    if key == "fast":
        return DecodePlan(_ONE, None, cost, True)
    if key == "region":
        return DecodePlan(_ONE, region_box(header, crop), cost)
    return DecodePlan(Fraction(int(key[0]), 8), None, cost)


def execute(
    plan: DecodePlan,
    data: Any,
    decoder: Any,
    header: ImageHeader,
    crop: Crop,
    dst: np.ndarray | None = None,
    max_pixels: int | None = None,
) -> np.ndarray:
    """Decodes ``data`` as ``plan`` says (into this thread's scratch buffer), then crops and
    resizes into ``dst`` when given. The result never points into the scratch buffer."""
    buf = None if plan.region is not None else scratch(math.prod(scaled_size(header, plan.scale)) * 3)
    if buf is not None and not crop.window and isinstance(decoder, TurboJPEGDecoder) and decoder.strict_regions:
        # Only the rows and columns the crop reads, as strictly as the whole (turbo.py), into
        # their places in the whole decode's layout: the resize below runs as on a whole decode.
        check_pixels(header, max_pixels)
        h, w = scaled_size(header, plan.scale)
        top, left, right = crop.reads(h, w, float(plan.scale))
        img, _ = decoder.decode_region(data, header, plan.scale, top, left, right, plan.fast_upsample, buf)
    else:
        img = plan.decode(data, decoder, header, max_pixels, buf)
    out = crop.apply(img, header.height, header.width, dst, float(plan.scale), plan.origin)
    if buf is not None and out is not dst and np.may_share_memory(out, buf):
        out = out.copy()  # a crop of the whole image at its size: the scratch is reused next
    return out


def _lin(c: list[float], x: list[float]) -> float:
    return sum(ci * xi for ci, xi in zip(c, x))


class Planner:
    """Chooses a :class:`DecodePlan` per sample from fitted costs (see :func:`calibrate`).

    Args:
        costs: The fitted costs, as :data:`DEFAULT_COSTS` or a calibration's JSON.
        region: Whether region decode may be planned for every sample (it must be available).
        margin: How much cheaper than the full decode another plan must be predicted.
        verified_region: Whether region decode may be planned for a sample whose bytes were
            verified strictly (:meth:`choose`'s ``verified``); None (default): where
            ``region`` says so or a region decoder is available (asked on the first verified sample).
    """

    def __init__(
        self, costs: dict[str, Any], region: bool, margin: float = MARGIN, verified_region: bool | None = None
    ) -> None:
        self.costs = costs
        self._decode = dict(costs["decode"])
        self._resize = {**costs["resize"], "none": [0.0, 0.0, 0.0, 0.0]}
        # (scale as float, key), largest first; floats: Fraction arithmetic is slow.
        self._scales = [(int(k[0]) / 8, k) for k in reversed(SCALE_KEYS) if k in self._decode]
        self._region = region and "region" in self._decode
        self._verified_region: bool | None = (
            True if self._region else None if verified_region is None else verified_region and "region" in self._decode
        )
        self.margin = margin

    @property
    def region(self) -> bool:
        return self._region

    def predict(self, header: ImageHeader, crop: Crop, key: str) -> float:
        """Predicted µs of plan ``key`` (decode, crop and resize) for ``crop`` of the image."""
        return self._price(header, crop, (crop,), key)

    def _price(self, header: ImageHeader, union: Crop, crops: Sequence[Crop], key: str) -> float:
        """µs of one decode of plan ``key`` for ``union`` (the crops' bounding box) and each crop's resize."""
        cost = _lin(self._decode[key], decode_features(header, union, key))
        for c in crops:
            path, x = resize_features(header, c, key)
            cost += _lin(self._resize[path], x)
        return cost

    def choose(
        self, header: ImageHeader, crops: Crop | Sequence[Crop], scales: bool = True, verified: bool = False
    ) -> DecodePlan:
        """The cheapest single decode serving ``crops`` (one crop, or the views of a
        multi-view transform) of the JPEG described by ``header``.

        Each plan is priced as one decode plus every crop's resize; a DCT scale or fast
        upsampling must suit every crop; a region is the crops' union box.

        Args:
            header: The image's header (``nbytes`` set, as :func:`read_header` does).
            crops: The crop(s) and the size each is resized to.
            scales: Allow DCT-scaled and fast-upsampled decodes (False: only plans with a
                full decode's pixels).
            verified: The sample's bytes were verified strictly before (their checksum
                matched): a region decode, which cannot see damage, may be planned.
        """
        if isinstance(crops, Crop):
            crops = (crops,)
        if len(crops) == 1:
            union = crops[0]
        else:
            top, left = min(c.top for c in crops), min(c.left for c in crops)
            union = Crop(
                top, left, max(c.top + c.height for c in crops) - top, max(c.left + c.width for c in crops) - left, 1, 1
            )
        decode, price = self._decode, self._price
        full = price(header, union, crops, "full")
        best_cost, best_key = full, "full"
        antialiased = [c for c in crops if c.antialias]
        windows = any(c.window for c in antialiased)
        if scales and "fast" in decode and len(antialiased) == len(crops) and not windows:
            cost = price(header, union, crops, "fast")
            if cost < best_cost:
                best_cost, best_key = cost, "fast"
        if scales and min(header.height, header.width) >= 8:  # smaller: scales collide in size
            # Each crop's decoded pixels per output pixel at full size, and the least it may keep.
            ratios = [(min(c.height / c.out_h, c.width / c.out_w), MIN_RATIO if c.antialias else 1.0) for c in crops]
            for f, key in self._scales:  # descending: stop at the first scale too small for a crop
                if any(r * f < need for r, need in ratios):
                    break
                cost = price(header, union, crops, key)
                if cost < best_cost and all(c.window or self._phase_ok(c, f) for c in antialiased):
                    best_cost, best_key = cost, key
        regions = self._regions_for_verified() if verified else self._region
        if regions and not windows and header.components == 3 and not header.progressive:
            cost = price(header, union, crops, "region")
            if cost < best_cost:
                best_cost, best_key = cost, "region"
        if best_key != "full" and best_cost > (1 - self.margin) * full:
            return DecodePlan(_ONE, None, full)
        return plan_for_key(best_key, header, union, best_cost)

    def _regions_for_verified(self) -> bool:
        if self._verified_region is None:
            self._verified_region = "region" in self._decode and roi.region_available()
        return self._verified_region

    @staticmethod
    def _phase_ok(crop: Crop, s: float) -> bool:
        return (
            phase_error(crop.top * s, crop.height * s / crop.out_h) <= PHASE_TOL
            and phase_error(crop.left * s, crop.width * s / crop.out_w) <= PHASE_TOL
        )


_lock = threading.Lock()
_planner: Planner | None = None
_planner_source: tuple[str | None, ...] | None = None  # the environment _planner's costs came from
_SOURCE_VARIABLES = ("XDG_CACHE_HOME", "FASTLOAD_CACHE_DIR", "FASTLOAD_NO_CALIBRATION", "FASTLOAD_ROI")


def _costs_source() -> tuple[str | None, ...]:
    """The variables that say where this process's costs come from (:func:`.costs.cache_dir`,
    :func:`.costs.calibration_disabled`): read per sample, so plain lookups, no path work."""
    return tuple(os.environ.get(name) for name in _SOURCE_VARIABLES)


_warned_trusted = False


def _legacy_trusted() -> bool:
    """``FASTLOAD_ROI=trusted`` (every sample treated as verified), with a DeprecationWarning once per process."""
    global _warned_trusted
    trusted = roi.trusted()
    if trusted and not _warned_trusted:
        _warned_trusted = True
        warnings.warn(
            "FASTLOAD_ROI=trusted is deprecated: it plans region decodes, which cannot see damage, for every "
            "file; run `fastload verify DIR` (or convert with --verify) instead: a file whose checksum still "
            "matches is then decoded as cheaply, and one that changed is refused",
            DeprecationWarning,
            stacklevel=4,
        )
    return trusted


def get_planner() -> Planner:
    """The process's planner: cached costs (or DEFAULT_COSTS under FASTLOAD_NO_CALIBRATION=1),
    region decode for samples verified strictly before (where a region decoder is available,
    :func:`fastload.decode.roi.region_available`), and for every sample under the deprecated
    ``FASTLOAD_ROI=trusted`` (:func:`fastload.decode.roi.trusted`).

    Built once per process, and again if the environment it came from changed
    (``XDG_CACHE_HOME``, ``FASTLOAD_CACHE_DIR``, ``FASTLOAD_NO_CALIBRATION``,
    ``FASTLOAD_ROI``): a process started with this environment would plan by it, and
    plans must be the same in both."""
    global _planner, _planner_source
    source = _costs_source()
    if _planner is None or _planner_source != source:
        with _lock:
            if _planner is None or _planner_source != source:
                costs = DEFAULT_COSTS if calibration_disabled() else load_or_calibrate()
                trusted = _legacy_trusted()
                planner = Planner(costs, trusted)
                _planner, _planner_source = planner, source
    return _planner


def set_planner(planner: Planner | None) -> None:
    """Makes ``planner`` this process's (None: rebuilt from the cache on next use), for as long
    as the environment names the same cache. Forked workers inherit it; spawned ones build
    their own from the cache."""
    global _planner, _planner_source
    with _lock:
        _planner, _planner_source = planner, _costs_source()


def choose(
    header: ImageHeader, crops: Crop | Sequence[Crop], scales: bool = True, verified: bool = False
) -> DecodePlan:
    """The process planner's single decode serving ``crops`` (one crop or several); ``verified``:
    the sample's bytes were verified strictly before (see :meth:`Planner.choose`)."""
    return get_planner().choose(header, crops, scales, verified)
