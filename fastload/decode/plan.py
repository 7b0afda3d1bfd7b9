"""Decode plans chosen by measured cost: full decode, a DCT scale, or a region decode.

For each sample whose transform starts with a crop, :meth:`Planner.choose` prices every
way to get the crop's pixels, the resize after it included, and takes the cheapest that
stays within the antialiased reference's tolerance:

* a full decode (always allowed; nothing is ever planned slower than it);
* a full decode with fast chroma upsampling (libjpeg's replication instead of its
  triangle filter; 8% faster on 4:2:0 photos, 0.3 levels of 255 from the reference
  after the resize, worst image 1.5), for random crops (not for eval windows);
* a DCT-scaled decode at n/8 (libjpeg-turbo), when the crop is still at least
  :data:`MIN_RATIO` times its output size at that scale and the resize can start on
  the crop's exact phase (:func:`fastload.resize.phase_error`);
* a region decode (:mod:`fastload.decode.roi`, when installed): the crop's pixels exactly.

Costs are linear models (µs) in the encoded bytes and pixels each option touches,
fitted by :func:`fastload.decode.costs.calibrate` in about half a second on photo-like
JPEGs and cached in ``~/.cache/fastload/`` keyed by the library versions and CPU model. Every process on
a machine reads the same cache (the first one to need it calibrates under a file lock,
the others wait), so the plan of a sample, and so its pixels, never depends on which
worker or process decoded it. ``FASTLOAD_NO_CALIBRATION=1`` uses the built-in
``costs.DEFAULT_COSTS`` (measured on a 2-core Xeon, libjpeg-turbo 2.1.5) instead.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from . import roi
from .costs import DEFAULT_COSTS, load_or_calibrate
from .header import ImageHeader, check_jpeg_complete

if TYPE_CHECKING:
    from ..resize import Crop

#: A DCT-scaled decode is used only when the crop keeps at least this many decoded
#: pixels per output pixel (on each side). Measured on real photos against Pillow's
#: antialiased resize of the full-size crop, with the exact-phase resize: at 1.25-1.5
#: per-image error mean 0.7-1.2, worst 2.9 levels of 255 (1/4 to 7/8 scales); at 1.0-1.25
#: the 1/4 scale averages 1.6, over the 1.5 tolerance.
MIN_RATIO = 1.25

# (constant µs, µs per encoded byte, µs per pixel)
Linear = tuple[float, float, float]


@dataclass(frozen=True)
class DecodePlan:
    """How one sample is decoded.

    Attributes:
        scale: DCT scale of the decode (1: full size).
        region: (y0, x0, y1, x1) in full-size pixels for a region decode, else None.
        cost: Predicted µs for the decode and the resize after it.
        fast_upsample: Chroma upsampled by replication (a full-size TurboJPEG decode).
    """

    scale: Fraction = Fraction(1)
    region: tuple[int, int, int, int] | None = None
    cost: float = 0.0
    fast_upsample: bool = False

    @property
    def kind(self) -> str:
        """"full", "region" or "scale n/8": for counting plans."""
        if self.region is not None:
            return "region"
        if self.fast_upsample:
            return "full, fast upsampling"
        return "full" if self.scale == 1 else f"scale {self.scale.numerator * 8 // self.scale.denominator}/8"

    @property
    def origin(self) -> tuple[int, int]:
        """Where the decoded pixels start in the full-size image."""
        return (self.region[0], self.region[1]) if self.region is not None else (0, 0)

    def decode(self, data: Any, decoder: Any, header: ImageHeader, max_pixels: int | None = None) -> np.ndarray:
        """The planned pixels: ``decoder`` (TurboJPEG) at ``scale``, or the region decoder."""
        if self.region is None:
            if self.fast_upsample:
                return decoder.decode(data, header=header, max_pixels=max_pixels, scale=self.scale, fast_upsample=True)
            return decoder.decode(data, header=header, max_pixels=max_pixels, scale=self.scale)
        check_jpeg_complete(data)
        return roi.get_region_decoder().decode(data, *self.region)


_ONE = Fraction(1)


def _lin(c: Linear, nbytes: float, pixels: float) -> float:
    return c[0] + c[1] * nbytes + c[2] * pixels


class Planner:
    """Chooses a :class:`DecodePlan` per sample from fitted costs (see :func:`calibrate`).

    Args:
        costs: The fitted costs, as :data:`DEFAULT_COSTS` or a calibration's JSON.
        region: Whether region decode may be planned (it must be available).
    """

    def __init__(self, costs: dict[str, Any], region: bool) -> None:
        self.costs = costs
        self._decode = {Fraction(k): tuple(v) for k, v in costs["decode"].items()}
        self._full = self._decode[Fraction(1)]
        self._fast: Linear | None = tuple(costs["decode_fast"]) if costs.get("decode_fast") else None
        # (scale, as float, its costs), largest first; floats: Fraction arithmetic is slow.
        smaller = sorted((s for s in self._decode if s < 1), reverse=True)
        self._scales = [(s, float(s), self._decode[s]) for s in smaller]
        self._region: Linear | None = tuple(costs["region"]) if region and costs.get("region") else None
        self._resize: Linear = tuple(costs["resize"])
        self._copy = float(costs["copy"])

    @property
    def region(self) -> bool:
        return self._region is not None

    def _resize_cost(self, in_h: float, in_w: float, out_w: float, copy: bool) -> float:
        # The kernel's horizontal pass reads every input pixel, its vertical pass in_h x out_w.
        r = self._resize
        return r[0] + r[1] * in_h * in_w + r[2] * in_h * out_w + (self._copy * in_h * in_w if copy else 0.0)

    def choose(self, header: ImageHeader, crop: Crop, scales: bool = True, allow_region: bool = True) -> DecodePlan:
        """The cheapest plan for ``crop`` of the JPEG described by ``header``.

        Args:
            header: The image's header (``nbytes`` set, as :func:`read_header` does).
            crop: The crop and the size it is resized to.
            scales: Allow DCT-scaled and fast-upsampled decodes (False: only plans with a
                full decode's pixels).
            allow_region: Allow a region decode (False for a sample not known to decode cleanly).
        """
        h, w = header.height, header.width
        pixels = h * w
        nbytes = header.nbytes or 0.25 * pixels  # unknown: 2 bits per pixel
        window = crop.window and crop.antialias
        if window:  # resize_window filters every row above and column left of the window
            in_h, in_w = min(h, crop.top + crop.height), min(w, crop.left + crop.width)
            out_w = crop.out_w * in_w / crop.width
        else:
            in_h, in_w, out_w = crop.height, crop.width, crop.out_w
        copy = window or crop.width < w  # a crop of whole rows is already contiguous
        best_cost = _lin(self._full, nbytes, pixels) + self._resize_cost(in_h, in_w, out_w, copy)
        best_scale, region, fast = _ONE, None, False
        if scales and self._fast is not None and crop.antialias and not crop.window:
            cost = _lin(self._fast, nbytes, pixels) + self._resize_cost(in_h, in_w, out_w, copy)
            if cost < best_cost:
                best_cost, fast = cost, True
        if scales:
            need = MIN_RATIO if crop.antialias else 1.0
            ratio = min(crop.height / crop.out_h, crop.width / crop.out_w)
            for s, f, c in self._scales:  # descending: stop at the first too small
                if ratio * f < need:
                    break
                cost = _lin(c, nbytes, pixels) + self._resize_cost(in_h * f, in_w * f, out_w, copy)
                if cost < best_cost and (window or not crop.antialias or self._phase_ok(crop, f)):
                    best_cost, best_scale, fast = cost, s, False
        if (allow_region and self._region is not None and not window and header.components == 3
                and not header.progressive):
            y0, x0 = int(crop.top), int(crop.left)
            y1, x1 = min(h, math.ceil(crop.top + crop.height)), min(w, math.ceil(crop.left + crop.width))
            # Whole rows y0:y1 are decoded (nvImageCodec does not crop columns), rows
            # above are entropy-decoded only, rows below never read.
            cost = (_lin(self._region, nbytes * y1 / h, (y1 - y0) * w)
                    + self._resize_cost(y1 - y0, x1 - x0, out_w, False))
            if cost < best_cost:
                best_cost, best_scale, region, fast = cost, _ONE, (y0, x0, y1, x1), False
        return DecodePlan(best_scale, region, best_cost, fast)

    @staticmethod
    def _phase_ok(crop: Crop, s: float) -> bool:
        from ..resize import PHASE_TOL, phase_error

        return (phase_error(crop.top * s, crop.height * s / crop.out_h) <= PHASE_TOL
                and phase_error(crop.left * s, crop.width * s / crop.out_w) <= PHASE_TOL)


_lock = threading.Lock()
_planner: Planner | None = None


def get_planner() -> Planner:
    """The process's planner: cached costs (or DEFAULT_COSTS under FASTLOAD_NO_CALIBRATION=1),
    region decode when available. Built once per process."""
    global _planner
    if _planner is None:
        with _lock:
            if _planner is None:
                no_cal = os.environ.get("FASTLOAD_NO_CALIBRATION", "").strip().lower() not in ("", "0", "false", "no")
                costs = DEFAULT_COSTS if no_cal else load_or_calibrate()
                _planner = Planner(costs, roi.available())
    return _planner


def set_planner(planner: Planner | None) -> None:
    """Makes ``planner`` this process's (None: rebuilt from the cache on next use). Forked
    workers inherit it; spawned ones build their own from the cache."""
    global _planner
    with _lock:
        _planner = planner


def recalibrate() -> Planner:
    """Calibrates again, rewrites the cache and replaces this process's planner (other
    processes keep theirs until restarted)."""
    global _planner
    with _lock:
        _planner = Planner(load_or_calibrate(redo=True), roi.available())
    return _planner


def choose(header: ImageHeader, crop: Crop, scales: bool = True, allow_region: bool = True) -> DecodePlan:
    """The process planner's plan for ``crop`` of the image with ``header``."""
    return get_planner().choose(header, crop, scales, allow_region)
