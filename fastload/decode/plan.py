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
fitted by :func:`calibrate` in about half a second on photo-like JPEGs and cached in
``~/.cache/fastload/`` keyed by the library versions and CPU model. Every process on
a machine reads the same cache (the first one to need it calibrates under a file lock,
the others wait), so the plan of a sample, and so its pixels, never depends on which
worker or process decoded it. ``FASTLOAD_NO_CALIBRATION=1`` uses :data:`DEFAULT_COSTS`
(measured on a 2-core Xeon, libjpeg-turbo 2.1.5) instead; ``FASTLOAD_CACHE_DIR`` moves
the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import platform
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from . import roi
from .header import ImageHeader, check_jpeg_complete

if TYPE_CHECKING:
    from ..resize import Crop

#: A DCT-scaled decode is used only when the crop keeps at least this many decoded
#: pixels per output pixel (on each side). Measured on real photos against Pillow's
#: antialiased resize of the full-size crop, with the exact-phase resize: at 1.25-1.5
#: per-image error mean 0.7-1.2, worst 2.9 levels of 255 (1/4 to 7/8 scales); at 1.0-1.25
#: the 1/4 scale averages 1.6, over the 1.5 tolerance.
MIN_RATIO = 1.25

CALIBRATION_VERSION = 2

# (constant µs, µs per encoded byte, µs per pixel)
Linear = tuple[float, float, float]

#: Costs measured by :func:`calibrate` on a 2-core Intel Xeon (libjpeg-turbo 2.1.5,
#: nvImageCodec 0.9.0, torch 2.13): used under FASTLOAD_NO_CALIBRATION=1 and when no
#: cache can be written.
DEFAULT_COSTS: dict[str, Any] = {
    "decode": {"1/8": [11.72, 0.006632, 0.0005209], "1/4": [30.77, 0.007545, 0.0005818],
               "3/8": [21.98, 0.007802, 0.0009576], "1/2": [16.7, 0.00767, 0.0009054],
               "5/8": [15.93, 0.007984, 0.002064], "3/4": [38.64, 0.007626, 0.002441],
               "7/8": [29.2, 0.007738, 0.003701], "1": [13.65, 0.007907, 0.001629]},
    "decode_fast": [13.65, 0.007907, 0.0013],
    "region": [78.93, 0.007265, 0.001791],
    "resize": [18.88, 0.0004074, 0.001067],
    "copy": 0.0002,
}


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
        self._scales = [(s, float(s), self._decode[s]) for s in sorted((s for s in self._decode if s < 1), reverse=True)]
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

    def choose(self, header: ImageHeader, crop: Crop, scales: bool = True) -> DecodePlan:
        """The cheapest plan for ``crop`` of the JPEG described by ``header``.

        Args:
            header: The image's header (``nbytes`` set, as :func:`read_header` does).
            crop: The crop and the size it is resized to.
            scales: Allow DCT-scaled and fast-upsampled decodes (False: only plans with a
                full decode's pixels).
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
        best_cost = _lin(self._full, nbytes, pixels) + self._resize_cost(in_h, in_w, out_w, True)
        best_scale, region, fast = _ONE, None, False
        if scales and self._fast is not None and crop.antialias and not crop.window:
            cost = _lin(self._fast, nbytes, pixels) + self._resize_cost(in_h, in_w, out_w, True)
            if cost < best_cost:
                best_cost, fast = cost, True
        if scales:
            need = MIN_RATIO if crop.antialias else 1.0
            ratio = min(crop.height / crop.out_h, crop.width / crop.out_w)
            for s, f, c in self._scales:  # descending: stop at the first too small
                if ratio * f < need:
                    break
                cost = _lin(c, nbytes, pixels) + self._resize_cost(in_h * f, in_w * f, out_w, True)
                if cost < best_cost and (window or not crop.antialias or self._phase_ok(crop, f)):
                    best_cost, best_scale, fast = cost, s, False
        if self._region is not None and not window and header.components == 3 and not header.progressive:
            y0, x0 = int(crop.top), int(crop.left)
            y1, x1 = min(h, math.ceil(crop.top + crop.height)), min(w, math.ceil(crop.left + crop.width))
            cost = (_lin(self._region, nbytes * y1 / h, (y1 - y0) * (x1 - x0))
                    + self._resize_cost(y1 - y0, x1 - x0, out_w, False))
            if cost < best_cost:
                best_cost, best_scale, region, fast = cost, _ONE, (y0, x0, y1, x1), False
        return DecodePlan(best_scale, region, best_cost, fast)

    @staticmethod
    def _phase_ok(crop: Crop, s: float) -> bool:
        from ..resize import PHASE_TOL, phase_error

        return (phase_error(crop.top * s, crop.height * s / crop.out_h) <= PHASE_TOL
                and phase_error(crop.left * s, crop.width * s / crop.out_w) <= PHASE_TOL)


# --- calibration ------------------------------------------------------------------------


def _fit(rows: list[list[float]], times: list[float]) -> list[float]:
    """Least squares with non-negative coefficients (terms that fit negative are dropped)."""
    x, y = np.asarray(rows, float), np.asarray(times, float)
    keep = list(range(x.shape[1]))
    while True:
        coef = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (coef >= 0).all() or len(keep) == 1:
            out = [0.0] * x.shape[1]
            for k, c in zip(keep, coef):
                out[k] = max(0.0, float(c))
            return out
        keep.pop(int(np.argmin(coef)))


def _best_time(fn, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def _calibration_jpegs() -> list[bytes]:
    """Photo-like JPEGs of 0.08-0.3 megapixels and ~1-4 bits per pixel, as photos are."""
    from PIL import Image

    from ..sample import photo_like

    out = []
    for i, ((h, w), q) in enumerate((((240, 320), 60), ((360, 480), 97), ((384, 512), 70), ((480, 640), 90),
                                     ((300, 450), 85), ((512, 384), 95), ((256, 384), 92), ((420, 560), 65))):
        rng = np.random.default_rng((20261122, i))
        buf = io.BytesIO()
        Image.fromarray(photo_like(rng, h, w, rng.uniform(-1, 1, 3))).save(buf, format="JPEG", quality=q)
        out.append(buf.getvalue())
    return out


def calibrate(repeat: int = 3, region: bool | None = None) -> dict[str, Any]:
    """Times each decode option and the resize here, one thread, and fits their costs.

    A decode at each scale costs a constant, an amount per encoded byte (the entropy
    decoding) and per pixel of the full-size image; a region decode per byte up to the
    region's last row and per pixel of the region; the resize per input pixel and per
    input row and output column.

    Returns:
        The costs as :data:`DEFAULT_COSTS` (JSON-able), with the seconds it took.
    """
    import torch

    from ..resize import resize
    from . import get_decoder, read_header

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        turbo = get_decoder("turbojpeg")
        blobs = _calibration_jpegs()
        headers = [read_header(b) for b in blobs]
        decode = {}
        for s in turbo.scales:
            rows, times = [], []
            for _ in range(repeat):  # rounds, so that a busy moment hits all images alike
                for b, hd in zip(blobs, headers):
                    rows.append([1.0, len(b), hd.height * hd.width])
                    times.append(_best_time(lambda b=b, hd=hd, s=s: turbo.decode(b, header=hd, scale=s), 1))
            decode[str(s)] = _fit_min(rows, times, len(blobs))
        rows, times = [], []
        for _ in range(repeat):
            for b, hd in zip(blobs, headers):
                rows.append([1.0, len(b), hd.height * hd.width])
                times.append(_best_time(lambda b=b, hd=hd: turbo.decode(b, header=hd, fast_upsample=True), 1))
        decode_fast = _fit_min(rows, times, len(blobs))
        region_costs = None
        if region if region is not None else roi.available():
            rd = roi.get_region_decoder()
            rows, times = [], []
            for _ in range(repeat):
                for b, hd in zip(blobs, headers):
                    hh, ww = hd.height, hd.width
                    for y0, x0, y1, x1 in ((hh // 4, ww // 4, 3 * hh // 4, 3 * ww // 4), (0, 0, hh // 3, ww // 2),
                                           (hh // 2, 0, hh, ww), (hh // 8, ww // 3, hh // 2, ww - 8)):
                        rows.append([1.0, len(b) * y1 / hh, (y1 - y0) * (x1 - x0)])
                        times.append(_best_time(lambda b=b, r=(y0, x0, y1, x1): rd.decode(b, *r), 1))
            region_costs = _fit_min(rows, times, len(blobs) * 4)
        img = turbo.decode(blobs[3])  # 480 x 640
        rows, times, copies = [], [], []
        for _ in range(repeat):
            for side, out in ((100, 224), (160, 224), (224, 224), (300, 224), (380, 224), (460, 224), (470, 160),
                              (200, 112), (330, 128), (400, 96)):
                crop = np.ascontiguousarray(img[:side, :side])
                rows.append([1.0, side * side, side * out])
                times.append(_best_time(lambda c=crop, o=out: resize(c, o, o), 1))
                copies.append(_best_time(lambda s=side: np.ascontiguousarray(img[5 : 5 + s, 7 : 7 + s]), 1) / side**2)
        costs = {"decode": decode, "decode_fast": decode_fast, "region": region_costs, "resize": _fit_min(rows, times, 10),
                 "copy": float(np.median(copies)), "seconds": round(time.perf_counter() - start, 3)}
    finally:
        torch.set_num_threads(threads)
    return costs


def _fit_min(rows: list[list[float]], times: list[float], n: int) -> list[float]:
    """Fits the fastest of each measurement's rounds (rows repeat every ``n``)."""
    t = np.asarray(times).reshape(-1, n).min(axis=0)
    return _fit(rows[:n], list(t))


# --- the process's planner, from the cache ---------------------------------------------


def cache_key() -> dict[str, Any]:
    """What the costs depend on: library versions and the CPU."""
    import torch

    from .. import __version__ as fastload_version
    from ..system import cpu_model
    from . import get_decoder

    try:
        lib = os.path.realpath(get_decoder("turbojpeg")._lib._name)
        libturbojpeg = f"{lib}:{os.path.getsize(lib)}"
    except (ImportError, OSError, AttributeError):
        libturbojpeg = None
    return {"calibration": CALIBRATION_VERSION, "fastload": fastload_version, "libturbojpeg": libturbojpeg,
            "nvimgcodec": roi.version(), "torch": torch.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "cpu": cpu_model(), "machine": platform.machine()}


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("FASTLOAD_CACHE_DIR") or os.path.join(base, "fastload")


def cache_path(key: dict[str, Any] | None = None) -> str:
    key = cache_key() if key is None else key
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"decode-costs-{digest}.json")


@contextlib.contextmanager
def _file_lock(path: str):
    import fcntl

    with open(path + ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_or_calibrate(redo: bool = False) -> dict[str, Any]:
    """The cached costs for this machine, calibrating (once, under a file lock) when
    there are none or ``redo``; :data:`DEFAULT_COSTS` where the cache cannot be written."""
    key = cache_key()
    path = cache_path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with _file_lock(path):
            if not redo and os.path.exists(path):
                with open(path) as f:
                    return json.load(f)["costs"]
            costs = calibrate()
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "costs": costs}, f, indent=1)
            os.replace(tmp, path)
            return costs
    except (OSError, ValueError, KeyError) as e:
        warnings.warn(f"fastload: cannot read or write the decode cost cache {path} ({e}); using the "
                      "built-in costs (fastload.decode.plan.DEFAULT_COSTS)", RuntimeWarning, stacklevel=2)
        return DEFAULT_COSTS


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


def choose(header: ImageHeader, crop: Crop, scales: bool = True) -> DecodePlan:
    """The process planner's plan for ``crop`` of the image with ``header``."""
    return get_planner().choose(header, crop, scales)
