"""Measured decode costs: the calibration behind :mod:`fastload.decode.plan`, and its cache.

:func:`calibrate` times, on one thread, a TurboJPEG decode at every DCT scale and with
fast upsampling, a region decode (when :mod:`fastload.decode.roi` is available) and
the antialiased resize, on photo-like JPEGs of 0.08-0.3 megapixels, and fits each as a
linear model in the bytes and pixels it touches: about half a second.
:func:`load_or_calibrate` keeps the result in ``~/.cache/fastload/`` (``FASTLOAD_CACHE_DIR``
moves it), one file per library versions and CPU model; the first process to need it
calibrates under a file lock and every other one reads that file, so all processes on
a machine plan alike. Where no cache can be written, :data:`DEFAULT_COSTS`.
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
import time
import warnings
from typing import Any

import numpy as np

from . import roi

#: Part of the cache key: a new version recalibrates.
CALIBRATION_VERSION = 3

#: Costs measured by :func:`calibrate` on a 2-core Intel Xeon (libjpeg-turbo 2.1.5,
#: nvImageCodec 0.9.0, torch 2.13): used under FASTLOAD_NO_CALIBRATION=1 and when no
#: cache can be written. Each model is (µs, µs per encoded byte, µs per pixel); the
#: resize's is (µs, per input pixel, per input row x output column); copy is µs per
#: pixel of a strided crop made contiguous.
DEFAULT_COSTS: dict[str, Any] = {
    "decode": {"1/8": [15.07, 0.00618, 0.0005037], "1/4": [37.41, 0.007072, 0.0004839],
               "3/8": [19.6, 0.007451, 0.0009156], "1/2": [38.79, 0.007043, 0.0007579],
               "5/8": [31.24, 0.007069, 0.001858], "3/4": [74.68, 0.007286, 0.002072],
               "7/8": [15.02, 0.00741, 0.003252], "1": [42.46, 0.006242, 0.001551]},
    "decode_fast": [42.46, 0.006242, 0.001459],
    "region": [66.35, 0.006242, 0.001551],
    "resize": [12.77, 0.0003814, 0.00103],
    "copy": 0.000169,
}


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
    decoding) and per pixel of the full-size image, fitted per scale. With fast
    upsampling, a full decode's constant and bytes, its own cost per pixel. A region
    decode costs a full decode of the bytes up to the region's last row and of its rows
    (all columns: nvImageCodec skips rows, jpeg_skip_scanlines, but decodes whole rows
    and copies the region's columns out), plus its own fitted overhead. The resize costs
    per input pixel and per input row and output column.

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
        # The same entropy decoding as a full decode, less upsampling work: only the cost
        # per pixel is fitted (a free fit trades bytes against pixels on 8 images).
        a, b_, p_ = decode["1"]
        fast = np.asarray(times).reshape(-1, len(blobs)).min(axis=0)
        extra = [(t - a - b_ * r[1]) / r[2] for t, r in zip(fast, rows)]
        decode_fast = [a, b_, max(0.0, float(np.median(extra)))]
        region_costs = None
        if region if region is not None else roi.available():
            rd = roi.get_region_decoder()
            rows, times = [], []
            for _ in range(repeat):
                for b, hd in zip(blobs, headers):
                    hh, ww = hd.height, hd.width
                    for y0, x0, y1, x1 in ((hh // 4, ww // 4, 3 * hh // 4, 3 * ww // 4), (0, 0, hh // 3, ww // 2),
                                           (hh // 2, 0, hh, ww), (hh // 8, ww // 3, hh // 2, ww - 8)):
                        rows.append([1.0, len(b) * y1 / hh, (y1 - y0) * ww])
                        times.append(_best_time(lambda b=b, r=(y0, x0, y1, x1): rd.decode(b, *r), 1))
            # A full decode of the rows it reads plus a fitted constant (nvImageCodec's own
            # overhead, >= 0): so a region is never predicted cheaper than the full decode
            # it would replace, whatever the noise, unless it skips work.
            t = np.asarray(times).reshape(-1, len(rows) // repeat).min(axis=0)
            over = [ti - a - b_ * r[1] - p_ * r[2] for ti, r in zip(t, rows)]
            region_costs = [a + max(0.0, float(np.median(over))), b_, p_]
        img = turbo.decode(blobs[3])  # 480 x 640
        rows, times, copies = [], [], []
        for _ in range(repeat):
            for side, out in ((100, 224), (160, 224), (224, 224), (300, 224), (380, 224), (460, 224), (470, 160),
                              (200, 112), (330, 128), (400, 96)):
                crop = np.ascontiguousarray(img[:side, :side])
                rows.append([1.0, side * side, side * out])
                times.append(_best_time(lambda c=crop, o=out: resize(c, o, o), 1))
                copies.append(_best_time(lambda s=side: np.ascontiguousarray(img[5 : 5 + s, 7 : 7 + s]), 1) / side**2)
        resize_costs = _fit_min(rows, times, 10)
        costs = {"decode": decode, "decode_fast": decode_fast, "region": region_costs, "resize": resize_costs,
                 "copy": float(np.median(copies)), "seconds": round(time.perf_counter() - start, 3)}
    finally:
        torch.set_num_threads(threads)
    return costs


def _fit_min(rows: list[list[float]], times: list[float], n: int) -> list[float]:
    """Fits the fastest of each measurement's rounds (rows repeat every ``n``)."""
    t = np.asarray(times).reshape(-1, n).min(axis=0)
    return _fit(rows[:n], list(t))


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
