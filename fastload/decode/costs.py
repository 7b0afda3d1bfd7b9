"""Measured plan costs: the calibration behind :mod:`fastload.decode.plan`, and its cache.

:func:`calibrate` times, on one thread, what every plan of the planner does (a full
decode, fast chroma upsampling, each DCT scale n/8, each into the thread's scratch
buffer; a region decode when :mod:`fastload.decode.roi` is available) and each resize
path after it (the crop of a full decode or region, the exact-phase box of a DCT-scaled
decode, an eval window: into a batch slot), on photographs (scikit-image's bundled
ones, cut as :func:`fastload.photos.jpegs.photo_jpeg` cuts the photo set; synthetic photo-like
images where scikit-image is not installed) with RandomResizedCrop crops and eval
windows. Every measurement of an image runs back to back, in several rounds, and keeps
its fastest; each decode and each resize path is fitted as a linear model of the bytes
and pixels it works on. It also times the two libjpeg-turbo backends' full decodes where
both load and records the faster (:data:`BACKEND_MARGIN`). A few seconds, once per
machine.

:func:`load_or_calibrate` keeps the result in ``~/.cache/fastload/`` (``FASTLOAD_CACHE_DIR``
moves it), one file per library versions and CPU model; the first process to need it
calibrates under a file lock and every other one reads that file, so all processes on
a machine plan alike. Where no cache can be written, :data:`DEFAULT_COSTS`.

A calibration made beside other jobs is not trusted: :func:`calibrate` records how many
CPUs other processes kept busy while it ran, and the CPU time the hypervisor stole
(:func:`machine_load`); one made where they left its thread less than a core of its own
(:func:`noisy`) is cached with those figures, and no process plans with it: each uses
:data:`DEFAULT_COSTS`' models instead (:func:`usable`), and the first one to find it older
than :data:`RETRY_S` (and is not a Loader's worker process, whose plans must match those of
the workers started before it) calibrates again, and the new calibration replaces it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import tempfile
import time
import warnings
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from . import roi
from .backends import available, named

if TYPE_CHECKING:
    from .header import ImageHeader
    from .resize import Crop

#: Part of the cache key: a new version recalibrates. 6: calibrations record the machine's
#: load (a cache made before could have been made on a busy machine, and cannot tell).
CALIBRATION_VERSION = 6

#: A calibration is noisy when the other processes kept more than all but this many of the
#: machine's CPUs busy on average while it ran: its one thread then shared a core with
#: them part of the time (1.5: a core of its own, and half a core for the rest of the system).
FREE_CPUS = 1.5

#: ... or when the hypervisor stole more than this share of the CPU time.
MAX_STEAL = 0.05

#: Seconds after which a noisy cached calibration is made again (by the next process that
#: needs it); before, processes use :data:`DEFAULT_COSTS` without calibrating, so that a
#: machine that stays busy does not spend seconds calibrating in every process.
RETRY_S = 600.0

#: The system libturbojpeg replaces simplejpeg as the default only when its full decode
#: takes at most this share of simplejpeg's time in the calibration.
BACKEND_MARGIN = 0.97

#: The plans priced, by cost key: full decode, fast upsampling, DCT scales, region.
SCALE_KEYS = tuple(f"{n}/8" for n in range(1, 8))
DECODE_KEYS = ("full", "fast", *SCALE_KEYS)

#: Costs fitted by :func:`calibrate` on the development machine on 2026-11-23 (2-core AMD
#: EPYC VM shared with other jobs, simplejpeg 1.9.0 = libjpeg-turbo 3.1.2, nvImageCodec
#: 0.9.0, torch 2.13, scikit-image's photographs): used under FASTLOAD_NO_CALIBRATION=1 and
#: where no cache can be written. ``decode``: µs = c0 + c1 x encoded bytes read + c2 x
#: pixels decoded (full-size pixels; a region's rows x the full width). ``resize``, per
#: path (:func:`resize_features`): µs = c0 + c1 x pixels resized + c2 x resized rows x
#: output columns + c3 x output pixels.
DEFAULT_COSTS: dict[str, Any] = {
    "backend": "simplejpeg",
    "decode": {
        "full": [0.0, 0.006998, 0.001986],
        "fast": [0.0, 0.006998, 0.001364],
        "1/8": [0.0, 0.006998, 0.0004782],
        "2/8": [0.0, 0.006998, 0.0006667],
        "3/8": [0.0, 0.006998, 0.001161],
        "4/8": [0.0, 0.006998, 0.000818],
        "5/8": [0.0, 0.006998, 0.002489],
        "6/8": [0.0, 0.006998, 0.003261],
        "7/8": [0.0, 0.006998, 0.004686],
        "region": [87.82, 0.006998, 0.001986],
    },
    "resize": {
        "crop": [0.0, 0.0008218, 0.000834, 0.001573],
        "window": [0.0, 3.997e-05, 0.002473, 4.815e-05],
        "box": [40.82, 0.0004452, 0.001715, 0.0],
    },
}


def calibration_disabled() -> bool:
    """Whether ``FASTLOAD_NO_CALIBRATION`` asks for :data:`DEFAULT_COSTS`."""
    return os.environ.get("FASTLOAD_NO_CALIBRATION", "").strip().lower() not in ("", "0", "false", "no")


def decode_features(header: ImageHeader, crop: Crop, key: str) -> list[float]:
    """(1, encoded bytes read, full-size pixels decoded) of plan ``key`` for ``crop``.

    A full or DCT-scaled decode reads every byte and decodes every pixel (at reduced
    cost per pixel when scaled); a region decode entropy-decodes the bytes down to the
    crop's last row and decodes its rows whole (nvImageCodec skips rows, not columns).
    """
    h, w = header.height, header.width
    nbytes = header.nbytes or 0.25 * h * w  # unknown: 2 bits per pixel
    if key == "region":
        y0, _, y1, _ = region_box(header, crop)
        return [1.0, nbytes * y1 / h, (y1 - y0) * w]
    return [1.0, nbytes, h * w]


def resize_features(header: ImageHeader, crop: Crop, key: str) -> tuple[str, list[float]]:
    """The resize path plan ``key`` takes for ``crop`` and its (1, pixels resized,
    resized rows x output columns, output pixels).

    Paths (:meth:`fastload.decode.resize.Crop.apply`): "crop", the crop of a full-size decode
    (or a region) copied contiguous and resized into the slot; "box", the crop of a
    DCT-scaled decode at its exact phase (edge-padded copy, extra phase rows, a copy
    into the slot); "window", an eval window, resized with every row above and column
    left of it. ``crop.antialias=False`` has no resize terms ("none": OpenCV's resize
    costs little next to a decode, whichever plan feeds it).
    """
    if not crop.antialias:
        return "none", [0.0, 0.0, 0.0, 0.0]
    h, w = header.height, header.width
    s = int(key[0]) / 8 if key in SCALE_KEYS else 1.0
    if crop.window:
        in_h, in_w = min(h, crop.top + crop.height) * s, min(w, crop.left + crop.width) * s
        out_w, path = crop.out_w * min(w, crop.left + crop.width) / crop.width, "window"
    else:
        in_h, in_w, out_w = crop.height * s, crop.width * s, crop.out_w
        path = "box" if s != 1 else "crop"
    return path, [1.0, in_h * in_w, in_h * out_w, crop.out_h * crop.out_w]


def region_box(header: ImageHeader, crop: Crop) -> tuple[int, int, int, int]:
    """(y0, x0, y1, x1): the whole pixels of ``crop`` a region decode returns."""
    y0, x0 = int(crop.top), int(crop.left)
    return (
        y0,
        x0,
        min(header.height, math.ceil(crop.top + crop.height)),
        min(header.width, math.ceil(crop.left + crop.width)),
    )


def _nnls(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares with non-negative coefficients (terms that fit negative are dropped)."""
    keep = list(range(x.shape[1]))
    while True:
        coef = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (coef >= 0).all() or len(keep) == 1:
            out = [0.0] * x.shape[1]
            for k, c in zip(keep, coef):
                out[k] = max(0.0, float(c))
            return out
        keep.pop(int(np.argmin(coef)))


def _fit(rows: list[list[float]], times: list[float]) -> list[float]:
    """Fits µs on ``rows`` of :func:`features`, each row weighted by 1 / its time, so that
    the relative error counts (small crops weigh as much as large ones); 4 significant digits."""
    x, y = np.asarray(rows, float), np.asarray(times, float)
    wt = 1.0 / np.maximum(y, 1.0)
    return [float(f"{c:.4g}") for c in _nnls(x * wt[:, None], y * wt)]


def _calibration_jpegs(count: int = 16) -> list[bytes]:
    """Baseline colour JPEGs like the photo set's: cut from scikit-image's photographs
    where installed, else synthetic photo-like images of the same sizes and qualities."""
    import io

    from PIL import Image

    from ..photos.jpegs import photo_jpeg, photo_like
    from .header import read_header

    try:
        from ..photos.bundled import source_photos

        sources = [Image.fromarray(a) for a in source_photos(gray=False).values()]
    except ImportError:
        sources = None
    out: list[bytes] = []
    seed = 0
    while len(out) < count:
        rng = np.random.default_rng((20261123, seed))
        seed += 1
        if sources is not None:
            data, _ = photo_jpeg(sources, rng)
        else:
            h, w = (int(v) for v in rng.integers(256, 513, 2))
            buf = io.BytesIO()
            Image.fromarray(photo_like(rng, h, w, rng.uniform(-1, 1, 3))).save(
                buf, format="JPEG", quality=int(rng.integers(75, 96))
            )
            data = buf.getvalue()
        header = read_header(data)
        if header.components == 3 and not header.progressive:  # what region decode takes
            out.append(data)
    return out


def choose_backend(blobs: list[bytes], rounds: int = 5) -> tuple[str, dict[str, float]]:
    """The faster libjpeg-turbo backend here: simplejpeg unless the system libturbojpeg's
    full decodes (into a reused buffer) take at most BACKEND_MARGIN of simplejpeg's time.
    Each image is decoded by both back to back, in turn first, and each decode keeps its
    fastest round, so that the load of a shared machine weighs on both alike. Returns
    (name, µs per image of each backend measured)."""
    from .header import read_header
    from .libjpeg import scratch
    from .turbo import TurboJPEGDecoder

    names = [n for n in ("simplejpeg", "turbojpeg") if available(n)]
    if len(names) < 2:
        return (names[0] if names else "simplejpeg"), {}
    headers = [read_header(b) for b in blobs]
    decoders = [named(n) for n in names]
    best = np.full((len(names), len(blobs)), np.inf)
    for r in range(rounds + 1):  # round 0 warms up
        for i, (b, hd) in enumerate(zip(blobs, headers)):
            for k in (0, 1) if (r + i) % 2 else (1, 0):
                t0 = time.perf_counter()
                decoders[k].decode(b, header=hd, out=scratch(hd.height * hd.width * 3))
                if r:
                    best[k, i] = min(best[k, i], time.perf_counter() - t0)
    us = {n: round(float(best[k].mean()) * 1e6, 1) for k, n in enumerate(names)}
    # With TurboJPEG 3's strict region decode (plan.execute decodes only the rows and columns
    # a crop reads: 7-13% less per sample on photos), the system library is taken unless its
    # whole decodes are slower by the margin.
    system = decoders[names.index("turbojpeg")]
    regions = isinstance(system, TurboJPEGDecoder) and system.strict_regions
    faster = us["turbojpeg"] * (BACKEND_MARGIN if regions else 1 / BACKEND_MARGIN) <= us["simplejpeg"]
    return ("turbojpeg" if faster else "simplejpeg"), us


def _calibration_crops(header: ImageHeader, rng: np.random.Generator) -> list[Crop]:
    """Crops of every resize path: RandomResizedCrop(224) crops ("crop"), the eval
    window (Resize 256, CenterCrop 224: "window"), and random crops resized to between
    1.25 and 2.5 times smaller than the crop at a DCT scale ("box", as planned)."""
    from .resize import Crop, random_resized_crop, resized_center_crop

    h, w = header.height, header.width
    ratio = (3 / 4, 4 / 3)
    crops = [random_resized_crop(h, w, (224, 224), (0.08, 1.0), ratio, rng) for _ in range(3)]
    crops.append(resized_center_crop(h, w, (224, 224), 256))
    for _ in range(3):
        c = random_resized_crop(h, w, (224, 224), (0.25, 1.0), ratio, rng)
        s = int(rng.integers(2, 8)) / 8
        out = int(np.clip(min(c.height, c.width) * s / rng.uniform(1.25, 2.5), 16, 224))
        crops.append(Crop(c.top, c.left, c.height, c.width, out, out))
    return crops


def _cpu_ticks() -> tuple[int, int, int, int] | None:
    """(busy, steal, all) clock ticks of every CPU since boot, from /proc/stat, and the
    number of CPUs; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = [int(v) for v in lines[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return total - idle - steal, steal, total, cpus


def machine_load(before: tuple[int, int, int, int] | None, own_cpu_s: float) -> dict[str, Any]:
    """What else the machine did since ``before`` (:func:`_cpu_ticks`), during which this
    process used ``own_cpu_s`` CPU seconds: ``others_cpus``, the CPUs other processes kept
    busy on average, ``steal``, the share of CPU time the hypervisor stole, ``cpus``, and
    ``noisy`` (:func:`noisy`). Empty where /proc/stat cannot be read."""
    after = _cpu_ticks()
    if before is None or after is None or after[2] <= before[2]:
        return {}
    cpus = max(1, after[3])
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    wall_ticks = (after[2] - before[2]) / cpus  # elapsed ticks of one CPU
    others = max(0.0, (after[0] - before[0]) - own_cpu_s * tick) / wall_ticks
    load = {
        "others_cpus": round(others, 3),
        "steal": round((after[1] - before[1]) / (after[2] - before[2]), 4),
        "cpus": cpus,
    }
    return {**load, "noisy": noisy(load)}


def noisy(load: dict[str, Any]) -> bool:
    """Whether a calibration made under ``load`` (:func:`machine_load`) shared its core: the
    other processes kept more than ``cpus - FREE_CPUS`` CPUs busy, or the hypervisor stole
    more than :data:`MAX_STEAL` of the time. A record without these figures is not noisy."""
    if not load:
        return False
    return load["others_cpus"] > max(0.0, load["cpus"] - FREE_CPUS) or load["steal"] > MAX_STEAL


def calibrate(repeat: int = 5, region: bool | None = None, images: int = 16) -> dict[str, Any]:
    """Times each decode, region decode and resize path here, one thread, and fits their costs.

    Decodes go into the thread's scratch buffer and crops are resized into a batch slot,
    as :func:`fastload.decode.plan.execute` runs them; measurements are interleaved in
    rounds and each one's median is fitted.

    Args:
        repeat: Rounds after a warm-up round.
        region: Calibrate region decode (None: where it is available).
        images: Calibration JPEGs (:func:`_calibration_jpegs`).

    Returns:
        The costs as :data:`DEFAULT_COSTS` (JSON-able), with the backend measured, its
        and the other backend's µs per full decode, the seconds it took, and ``load``:
        what else the machine did meanwhile (:func:`machine_load`).
    """
    import torch

    from .header import read_header

    start = time.perf_counter()
    ticks, own = _cpu_ticks(), time.process_time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        blobs = _calibration_jpegs(images)
        backend, backend_us = choose_backend(blobs)
        decoder = named(backend)
        headers = [read_header(b) for b in blobs]
        rng = np.random.default_rng(20261123)
        slot = np.empty((224, 224, 3), np.uint8)
        use_region = region if region is not None else roi.region_available()
        rd = roi.get_region_decoder() if use_region else None
        # (kind, key, features, run), every measurement of one image next to each other.
        jobs: list[tuple[str, str, list[float], Any]] = []
        for b, hd in zip(blobs, headers):
            jobs += _image_jobs(b, hd, _calibration_crops(hd, rng), decoder, rd, slot)
        # Rounds run the jobs of one image back to back, so that a busy moment of a shared
        # machine slows all plans alike; each job keeps its fastest round (load only adds).
        best = [math.inf] * len(jobs)
        for r in range(repeat + 1):  # round 0 warms up (scratch buffers, caches)
            for j, (_, _, _, run) in enumerate(jobs):
                t0 = time.perf_counter()
                run()
                if r:
                    best[j] = min(best[j], (time.perf_counter() - t0) * 1e6)
        fitted = {"decode": _fit_decodes(jobs, best), "resize": {}}
        for key in dict.fromkeys(key for kind, key, _, _ in jobs if kind == "resize"):
            mine = [j for j, job in enumerate(jobs) if job[:2] == ("resize", key)]
            fitted["resize"][key] = _fit([jobs[j][2] for j in mine], [best[j] for j in mine])
        return {
            "backend": backend,
            "backend_us": backend_us,
            **fitted,
            "images": len(blobs),
            "seconds": round(time.perf_counter() - start, 3),
            "load": machine_load(ticks, time.process_time() - own),
        }
    finally:
        torch.set_num_threads(threads)


def _fit_decodes(jobs: list, best: list[float]) -> dict[str, list[float]]:
    """Every decode's model, fitted together: one constant and one cost per encoded byte
    (the entropy decoding, the same whatever is done with the coefficients after) and a
    cost per pixel for each plan; fitted apart on a few images, bytes and pixels trade
    off and plans differ by noise. A region decode is the full decode's work on the
    bytes and rows it reads plus its own overhead, the median of what is left (>= 0): so
    a region of the whole image is never predicted cheaper than the full decode."""
    keys = [k for k in DECODE_KEYS if any(job[:2] == ("decode", k) for job in jobs)]
    rows, times = [], []
    for j, (kind, key, x, _) in enumerate(jobs):
        if kind == "decode" and key in keys:
            rows.append([1.0, x[1]] + [x[2] if key == k else 0.0 for k in keys])
            times.append(best[j])
    coef = _fit(rows, times)
    fitted = {k: [coef[0], coef[1], coef[2 + i]] for i, k in enumerate(keys)}
    region = [j for j, job in enumerate(jobs) if job[:2] == ("decode", "region")]
    if region:
        full = fitted["full"]
        left = [best[j] - full[1] * jobs[j][2][1] - full[2] * jobs[j][2][2] for j in region]
        fitted["region"] = [float(f"{max(full[0], float(np.median(left))):.4g}"), full[1], full[2]]
    return fitted


def _image_jobs(
    data: bytes, header: ImageHeader, crops: list[Crop], decoder: Any, region: Any, slot: np.ndarray
) -> list[tuple[str, str, list[float], Any]]:
    """The measurements of one calibration image: every decode (into the scratch buffer),
    a region decode of each RandomResizedCrop crop, and each crop's resize path."""
    from .libjpeg import scaled_size, scratch

    hd = header
    jobs = []
    x = [1.0, len(data), hd.height * hd.width]
    for key in DECODE_KEYS:
        s = _scale(key)
        jobs.append(
            (
                "decode",
                key,
                x,
                lambda s=s, key=key: decoder.decode(
                    data,
                    header=hd,
                    scale=s,
                    fast_upsample=key == "fast",
                    out=scratch(math.prod(scaled_size(hd, s)) * 3),
                ),
            )
        )
    full = decoder.decode(data, header=hd)
    for c in crops:
        if c.out_h == 224 and not c.window:  # the RandomResizedCrop crops: regions, resized crops
            if region is not None:
                box = region_box(hd, c)
                jobs.append(
                    ("decode", "region", decode_features(hd, c, "region"), lambda box=box: region.decode(data, *box))
                )
            jobs.append(
                (
                    "resize",
                    "crop",
                    resize_features(hd, c, "full")[1],
                    lambda c=c: c.apply(full, hd.height, hd.width, slot),
                )
            )
            continue
        if c.window:
            keys = ("full", "7/8", "6/8")
        else:  # the largest scale keeping the planner's 1.25 decoded pixels per output pixel
            key = f"{math.ceil(8 * c.out_h * 1.25 / min(c.height, c.width))}/8"
            keys = (key if key in SCALE_KEYS else "7/8",)
        for key in keys:
            s = _scale(key)
            img = decoder.decode(data, header=hd, scale=s)
            dst = slot if c.window else np.empty((c.out_h, c.out_w, 3), np.uint8)
            jobs.append(
                (
                    "resize",
                    "window" if c.window else "box",
                    resize_features(hd, c, key)[1],
                    lambda c=c, img=img, s=s, dst=dst: c.apply(img, hd.height, hd.width, dst, float(s)),
                )
            )
    return jobs


def _scale(key: str) -> Fraction:
    return Fraction(int(key[0]), 8) if key in SCALE_KEYS else Fraction(1)


def cache_key() -> dict[str, Any]:
    """What the costs depend on: library versions and the CPU."""
    import torch

    from .. import __version__ as fastload_version
    from ..system import cpu_model

    try:
        lib = named("turbojpeg").library_file()
        libturbojpeg = f"{lib}:{os.path.getsize(lib)}"
    except (ImportError, OSError):
        libturbojpeg = None
    try:
        simplejpeg = named("simplejpeg").version
    except ImportError:
        simplejpeg = None
    return {
        "calibration": CALIBRATION_VERSION,
        "fastload": fastload_version,
        "libturbojpeg": libturbojpeg,
        "simplejpeg": simplejpeg,
        "nvimgcodec": roi.version(),
        # Which one decodes regions (libjpeg-turbo 3's TurboJPEG API first, roi.get_region_decoder).
        "region_decoder": roi.get_region_decoder().name if roi.region_available() else None,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "machine": platform.machine(),
    }


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


def _complete(costs: Any) -> bool:
    """Whether ``costs`` has every model a Planner reads."""
    return (
        isinstance(costs, dict)
        and isinstance(costs.get("decode"), dict)
        and isinstance(costs.get("resize"), dict)
        and all(k in costs["decode"] for k in DECODE_KEYS)
        and all(k in costs["resize"] for k in ("crop", "box", "window"))
    )


def _in_loader_worker() -> bool:
    """Whether this process is a Loader's worker process: one that redid a calibration would
    plan differently from workers started before it, within one run."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def usable(costs: dict[str, Any]) -> dict[str, Any]:
    """The costs a planner may use from calibration ``costs``: themselves, or where the
    calibration was noisy (:func:`noisy`) :data:`DEFAULT_COSTS`' plan and resize models with
    the calibration's backend choice (each image decoded by both backends back to back, the
    fastest round kept: a busy machine slows both alike) and ``untrusted`` set."""
    if not noisy(costs.get("load") or {}):
        return costs
    kept = {k: costs[k] for k in ("backend", "backend_us", "load") if k in costs}
    return {**DEFAULT_COSTS, **kept, "untrusted": True}


def load_or_calibrate(redo: bool = False) -> dict[str, Any]:
    """The cached costs for this machine, calibrating (once, under a file lock) when
    there are none or ``redo``; :data:`DEFAULT_COSTS` where the cache cannot be written,
    and where the calibration was noisy (made beside other jobs, :func:`noisy`): one
    cached noisy is made again once it is :data:`RETRY_S` old, by a process that is not a
    Loader's worker."""
    key = cache_key()
    path = cache_path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with _file_lock(path):
            if not redo and os.path.exists(path):
                with open(path) as f:
                    costs = json.load(f).get("costs")
                if _complete(costs) and (
                    not noisy(costs.get("load") or {})
                    or time.time() - os.path.getmtime(path) < RETRY_S
                    or _in_loader_worker()  # its plans would differ from its siblings' (and the next epoch's)
                ):
                    return usable(costs)
            costs = calibrate()  # none yet, asked to redo, a file cut short, or an old noisy one
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "costs": costs}, f, indent=1)
            os.replace(tmp, path)
            return usable(costs)
    except (OSError, ValueError, KeyError) as e:
        warnings.warn(
            f"fastload: cannot read or write the decode cost cache {path} ({e}); using the "
            "built-in costs (fastload.decode.costs.DEFAULT_COSTS)",
            RuntimeWarning,
            stacklevel=2,
        )
        return DEFAULT_COSTS
