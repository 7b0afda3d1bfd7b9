"""Region decode at a DCT scale: which library decodes a RandomResizedCrop's pixels fastest.

For verified bytes (:mod:`fastload.verified`) fastload may decode only what a crop needs. This
times, per sample, one core, every path in a rotating order on the same crop before the next:

* ``full``: simplejpeg's whole decode (libjpeg-turbo bundled), then the crop (a view);
* ``scaled``: simplejpeg's whole decode at the smallest DCT scale n/8 that keeps the crop at
  least ``--min-ratio`` times its output size on each side (the planner's rule), then the crop;
* ``scaled-pow2``: the same at the smallest power-of-2 scale (1/2, 1/4, 1/8) the rule allows:
  libjpeg-turbo's SIMD code has reduced IDCTs for those only (3/8, 5/8, 6/8, 7/8 run in C);
* ``opencv-reduced``: OpenCV's ``IMREAD_REDUCED_COLOR_{2,4,8}`` (1/2, 1/4, 1/8 only) at the
  smallest power-of-2 scale that rule allows, BGR to RGB, then the crop;
* ``nvimgcodec-region``: nvImageCodec's CPU backend (``fastload[roi]``), the crop's box at full
  size (fastload's region decoder);
* ``tj3-region`` (fastload's :mod:`fastload.decode.roi_turbo`) and ``tj3-region-scaled``
  (this file's, at a DCT scale): libjpeg-turbo 3's TurboJPEG API through ctypes
  (``tj3SetCroppingRegion`` + ``tj3SetScalingFactor``): rows above the crop skipped, rows below
  never read, columns cut to the iMCU grid (widened one iMCU each side, where fancy
  upsampling makes a cut edge differ); at full size and at the ``scaled`` and ``scaled-pow2``
  rows' scales;
* ``pyturbojpeg-crop``: PyTurboJPEG's lossless ``crop`` (a new JPEG of the crop's iMCUs),
  then its decode at that scale.

The tj3 rows and PyTurboJPEG need a libturbojpeg >= 3.0: the system's, or one named by
``--turbojpeg-lib`` (e.g. the one in the ``turbojpeg`` wheel's ``turbojpeg.libs/``); they
are left out where there is none. Pixels: each path against the full decode's crop (at a
DCT scale, against the full decode resized to that scale with ``cv2.INTER_AREA``), max and
mean absolute difference over all samples, and the largest difference from simplejpeg's whole
decode at the same scale, cropped (0: the path's pixels are that decode's).

Photos: ``--large`` 2-8 MP photos (quality 85-95, 4:2:0, :func:`common.large_photos`) and
the ImageNet-sized photo dataset (:func:`common.photo_folder`).
"""

from __future__ import annotations

import math
import os
import re
import time
from fractions import Fraction

import cv2
import numpy as np
import simplejpeg
from common import large_photos, parser, photo_folder, report

from fastload.decode import roi, roi_turbo, turbo
from fastload.decode.header import read_header


def rrc(rng: np.random.Generator, h: int, w: int) -> tuple[int, int, int, int]:
    """A RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3), torchvision's sampling: (y0, x0, y1, x1)."""
    for _ in range(10):
        area = h * w * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            y0, x0 = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            return y0, x0, y0 + ch, x0 + cw
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, (h - side) // 2 + side, (w - side) // 2 + side


def dct_scale(box: tuple[int, int, int, int], out: int, min_ratio: float, pow2: bool) -> Fraction:
    """The smallest DCT scale keeping the box at least ``min_ratio`` x ``out`` on each side."""
    side = min(box[2] - box[0], box[3] - box[1])
    for n in (1, 2, 4) if pow2 else range(1, 8):
        if side * n / 8 >= min_ratio * out:
            return Fraction(n, 8)
    return Fraction(1)


def scaled_box(box: tuple[int, int, int, int], s: Fraction) -> tuple[int, int, int, int]:
    """The box in a decode at scale ``s``: whole pixels covering it."""
    y0, x0, y1, x1 = box
    return int(y0 * s), int(x0 * s), math.ceil(y1 * s), math.ceil(x1 * s)


class Tj3Region:
    """libjpeg-turbo 3's TurboJPEG API (fastload's ctypes bindings in :mod:`fastload.decode.turbo`):
    the rows and columns of a box, at a DCT scale, rows below never read (not strict)."""

    def __init__(self, path: str | None) -> None:
        if path:
            turbo._library_path = lambda: path  # the benchmark's library instead of the system's
        self.dec = turbo.TurboJPEGDecoder()
        if not self.dec.strict_regions:
            raise OSError("libturbojpeg is older than 3.0")
        self.file = self.dec.library_file()

    def decode(
        self, data: np.ndarray, box: tuple[int, int, int, int], s: Fraction, full: tuple[int, int]
    ) -> np.ndarray:
        lib, handle = self.dec._lib, self.dec._handle3().ptr
        y0, x0, y1, x1 = scaled_box(box, s)
        w = -(-full[1] * s.numerator // s.denominator)
        if lib.tj3DecompressHeader(handle, data.ctypes.data, data.size) != 0:
            raise RuntimeError(lib.tj3GetErrorStr(handle))
        mcu = -(-turbo.TJ_MCU_WIDTH[lib.tj3Get(handle, turbo.TJPARAM_SUBSAMP)] * s.numerator // s.denominator)
        left = max(0, x0 - mcu) // mcu * mcu
        right = min(w, x1 + mcu)
        lib.tj3SetScalingFactor(handle, turbo._ScalingFactor(s.numerator, s.denominator))
        bottom = y1  # rows below the crop: never read
        if lib.tj3SetCroppingRegion(handle, turbo._Region(left, y0, right - left, bottom - y0)) != 0:
            raise RuntimeError(lib.tj3GetErrorStr(handle))
        out = np.empty((bottom - y0, right - left, 3), np.uint8)
        if lib.tj3Decompress8(handle, data.ctypes.data, data.size, out.ctypes.data, out.shape[1] * 3, 0) != 0:
            raise RuntimeError(lib.tj3GetErrorStr(handle))
        return out[: y1 - y0, x0 - left : x1 - left]


class PyTurboCrop:
    """PyTurboJPEG's lossless crop to the iMCUs around the box, then its decode at the scale."""

    def __init__(self, path: str | None) -> None:
        from turbojpeg import TJPF_RGB, TurboJPEG

        self.tj, self.rgb = TurboJPEG(path), TJPF_RGB

    def decode(
        self, data: bytes, box: tuple[int, int, int, int], s: Fraction, mcu: tuple[int, int], size: tuple[int, int]
    ) -> np.ndarray:
        y0, x0, y1, x1 = box
        ty, tx = y0 // mcu[0] * mcu[0], x0 // mcu[1] * mcu[1]
        # Whole iMCUs on every side (preserve: PyTurboJPEG would trim a partial one off an image edge).
        bottom, right = min(size[0], -(-y1 // mcu[0]) * mcu[0]), min(size[1], -(-x1 // mcu[1]) * mcu[1])
        cropped = self.tj.crop(data, tx, ty, right - tx, bottom - ty, preserve=True)
        img = self.tj.decode(cropped, self.rgb, None if s == 1 else (s.numerator, s.denominator))
        sy0, sx0, sy1, sx1 = scaled_box(box, s)
        oy, ox = int(ty * s), int(tx * s)
        return img[sy0 - oy : sy1 - oy, sx0 - ox : sx1 - ox]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--large", type=int, default=12, help="2-8 MP photos")
    p.add_argument("--crops", type=int, default=4, help="crops per photo per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--min-ratio", type=float, default=1.25)
    p.add_argument("--turbojpeg-lib", default=None, help="a libturbojpeg >= 3.0 for the tj3 rows")
    args = p.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    cv2.setNumThreads(1)
    sets = {"2-8 MP": large_photos(os.path.join(args.data, "large"), 4 if args.quick else args.large)}
    args.images = min(args.images, 96)  # --quick: 48
    sets["ImageNet-sized"] = photo_folder(args, quiet=True)
    rd = roi.RegionDecoder() if roi.available() else None  # nvImageCodec's, whichever fastload takes
    try:
        tj3: Tj3Region | None = Tj3Region(args.turbojpeg_lib)
        trd: roi_turbo.TurboRegionDecoder | None = roi_turbo.TurboRegionDecoder()  # fastload's, same library
    except (OSError, RuntimeError) as e:
        print(f"tj3 rows left out: {e}")
        tj3, trd = None, None
    try:
        ptj: PyTurboCrop | None = PyTurboCrop(tj3.file if tj3 else None)
    except (OSError, ImportError, RuntimeError) as e:  # PyTurboJPEG: RuntimeError where it finds no library
        print(f"pyturbojpeg-crop left out: {e}")
        ptj = None
    nv_ext = os.path.join(os.path.dirname(roi.module().__file__), "extensions") if rd else None
    nv_lib = [os.path.join(nv_ext, n) for n in os.listdir(nv_ext) if n.startswith("libjpeg_turbo")] if nv_ext else []
    print(
        f"libraries: simplejpeg {simplejpeg.__version__} (libjpeg-turbo {_turbo_version(simplejpeg._jpeg.__file__)} "
        f"bundled); OpenCV {cv2.__version__} ({_opencv_jpeg()}); nvImageCodec "
        + (f"{roi.version()} (libjpeg-turbo {_turbo_version(nv_lib[0])} bundled)" if nv_lib else "not installed")
        + f"; tj3 rows and PyTurboJPEG: {tj3.file + f' (libjpeg-turbo {_turbo_version(tj3.file)})' if tj3 else 'none'}"
    )
    rng = np.random.default_rng(0)
    result: dict = {}
    for set_name, root in sets.items():
        files = []
        for dirpath, _, names in os.walk(root):
            files += [os.path.join(dirpath, n) for n in sorted(names) if n.lower().endswith((".jpg", ".jpeg"))]
        files = files[:4] if args.quick else files[: args.large * 4]
        times: dict[str, list[float]] = {}
        diffs: dict[str, list[tuple[int, float]]] = {}
        exact: dict[str, list[int]] = {}
        cpu: dict[str, list[float]] = {}  # CPU time of the process: what other jobs' load hardly inflates
        mp = []
        for r in range(1 if args.quick else args.rounds):
            for i, f in enumerate(files):
                data = open(f, "rb").read()
                arr = np.frombuffer(data, np.uint8)
                hd = read_header(data)
                if hd.components != 3 or hd.progressive:
                    continue
                full = simplejpeg.decode_jpeg(arr, "rgb")
                refs: dict = {}
                wholes: dict = {}
                mp.append(hd.height * hd.width / 1e6)
                for c in range(args.crops):
                    box = rrc(rng, hd.height, hd.width)
                    s = dct_scale(box, args.size, args.min_ratio, pow2=False)
                    s2 = dct_scale(box, args.size, args.min_ratio, pow2=True)
                    paths = crop_paths(arr, data, full.shape[:2], box, s, s2, rd, tj3, trd, ptj)
                    names = list(paths)
                    k = (r * 7 + i * args.crops + c) % len(names)
                    for name in names[k:] + names[:k]:  # rotating: no path always runs first
                        fn, scale = paths[name]
                        t0, c0 = time.perf_counter(), time.process_time()
                        out = fn()
                        times.setdefault(name, []).append(time.perf_counter() - t0)
                        cpu.setdefault(name, []).append(time.process_time() - c0)
                        if r == 0:
                            ref = _reference(full, box, scale, refs)
                            if out.shape != ref.shape:
                                raise SystemExit(f"{name}: {out.shape} for {ref.shape}, {f} {box} at {scale}")
                            d = np.abs(out.astype(np.int16) - ref.astype(np.int16))
                            diffs.setdefault(name, []).append((int(d.max()), float(d.mean())))
                            # And against simplejpeg's whole decode at the same scale, cropped.
                            same = _crop(_whole(arr, scale, full, wholes), box, scale)
                            e = np.abs(out.astype(np.int16) - same.astype(np.int16))
                            exact.setdefault(name, []).append(int(e.max()))
        print(
            f"\n{set_name}: {len(files)} photos, {np.median(mp):.1f} MP median, {len(times['full'])} crops, "
            "one core, times per crop in ms (median, p25-p75), pixels vs full decode + crop "
            "(scaled: vs full decode INTER_AREA-resized to that scale)"
        )
        base, cbase = np.median(times["full"]), np.median(cpu["full"])
        for name, ts in times.items():
            q1, q2, q3 = np.percentile(ts, [25, 50, 75]) * 1e3
            c2 = np.median(cpu[name]) * 1e3
            dmax = max(m for m, _ in diffs[name])
            dmean = float(np.mean([m for _, m in diffs[name]]))
            print(
                f"  {name:18s} wall {q2:6.2f} ms ({q1:6.2f}-{q3:6.2f}) cpu {c2:6.2f} ms  "
                f"x{base / np.median(ts):4.2f} (cpu x{cbase * 1e3 / c2:4.2f}) of full  "
                f"diff max {dmax:3d} mean {dmean:4.2f}; vs same-scale whole decode max {max(exact[name]):3d}"
            )
        # Per crop, the fastest of what pip's wheels offer fastload (what the planner picks among,
        # at best) against the fastest libjpeg-turbo 3 TurboJPEG row (CPU times).
        pip = [n for n in ("full", "scaled", "scaled-pow2", "opencv-reduced", "nvimgcodec-region") if n in cpu]
        tj = [n for n in cpu if n.startswith("tj3")]
        result[set_name] = {
            name: {
                "wall_ms": float(np.median(ts) * 1e3),
                "cpu_ms": float(np.median(cpu[name]) * 1e3),
                "diff_max": max(m for m, _ in diffs[name]),
                "same_scale_diff_max": max(exact[name]),
            }
            for name, ts in times.items()
        }
        best_pip = np.min([cpu[n] for n in pip], axis=0)
        print(f"  best per crop (cpu) of {', '.join(pip)}: {np.median(best_pip) * 1e3:.2f} ms median")
        if tj:
            best_tj = np.min([cpu[n] for n in tj], axis=0)
            print(
                f"  best per crop (cpu) of {', '.join(tj)}: {np.median(best_tj) * 1e3:.2f} ms median, "
                f"x{np.median(best_pip / best_tj):.2f} of the pip best (median of per-crop ratios)"
            )

    report("bench_region_decode", args, {"libturbojpeg": tj3.file if tj3 else None, "paths": result})


def crop_paths(arr, data, size, box, s, s2, rd, tj3, trd, ptj) -> dict:
    """Each path's call for one crop, and the DCT scale of its pixels."""
    sh, sw = -(-size[0] * s.numerator // s.denominator), -(-size[1] * s.numerator // s.denominator)
    h2, w2 = -(-size[0] * s2.numerator // s2.denominator), -(-size[1] * s2.numerator // s2.denominator)
    paths = {
        "full": (lambda: simplejpeg.decode_jpeg(arr, "rgb")[box[0] : box[2], box[1] : box[3]], Fraction(1)),
        "scaled": (lambda: _crop(simplejpeg.decode_jpeg(arr, "rgb", min_height=sh, min_width=sw), box, s), s),
        "scaled-pow2": (lambda: _crop(simplejpeg.decode_jpeg(arr, "rgb", min_height=h2, min_width=w2), box, s2), s2),
        "opencv-reduced": (lambda: _crop(_opencv(arr, s2), box, s2), s2),
    }
    if rd is not None:
        paths["nvimgcodec-region"] = (lambda: rd.decode(arr, *box), Fraction(1))
    if tj3 is not None:
        paths["tj3-region"] = (lambda: trd.decode(arr, *box), Fraction(1))  # fastload.decode.roi_turbo
        paths["tj3-region-scaled"] = (lambda: tj3.decode(arr, box, s, size), s)
        paths["tj3-region-pow2"] = (lambda: tj3.decode(arr, box, s2, size), s2)
    if ptj is not None:
        paths["pyturbojpeg-crop"] = (lambda: ptj.decode(data, box, s, (16, 16), size), s)  # 4:2:0 photos: 16x16 iMCUs
    return paths


def _crop(img: np.ndarray, box: tuple[int, int, int, int], s: Fraction) -> np.ndarray:
    y0, x0, y1, x1 = scaled_box(box, s)
    return img[y0:y1, x0:x1]


def _turbo_version(path: str) -> str:
    """The libjpeg-turbo version a library file names (its version string or source paths)."""
    with open(path, "rb") as f:
        found = re.search(rb"libjpeg-turbo(?: version |-)(\d+\.\d+\.\d+)", f.read())
    return found.group(1).decode() if found else "?"


def _opencv_jpeg() -> str:
    line = [x for x in cv2.getBuildInformation().splitlines() if x.strip().startswith("JPEG:")]
    return line[0].split(":", 1)[1].strip() if line else "JPEG: ?"


def _whole(arr: np.ndarray, s: Fraction, full: np.ndarray, cache: dict) -> np.ndarray:
    """simplejpeg's whole decode at DCT scale ``s``."""
    if s not in cache:
        h, w = -(-full.shape[0] * s.numerator // s.denominator), -(-full.shape[1] * s.numerator // s.denominator)
        cache[s] = full if s == 1 else simplejpeg.decode_jpeg(arr, "rgb", min_height=h, min_width=w)
    return cache[s]


def _opencv(arr: np.ndarray, s: Fraction) -> np.ndarray:
    flag = {
        1: cv2.IMREAD_COLOR,
        2: cv2.IMREAD_REDUCED_COLOR_2,
        4: cv2.IMREAD_REDUCED_COLOR_4,
        8: cv2.IMREAD_REDUCED_COLOR_8,
    }[s.denominator // s.numerator]
    return cv2.cvtColor(cv2.imdecode(arr, flag), cv2.COLOR_BGR2RGB)


def _reference(full: np.ndarray, box: tuple[int, int, int, int], s: Fraction, cache: dict) -> np.ndarray:
    """The full decode resized to scale ``s`` (INTER_AREA), cropped to the box there."""
    if s == 1:
        return full[box[0] : box[2], box[1] : box[3]]
    if s not in cache:
        h, w = -(-full.shape[0] * s.numerator // s.denominator), -(-full.shape[1] * s.numerator // s.denominator)
        cache[s] = cv2.resize(full, (w, h), interpolation=cv2.INTER_AREA)
    return _crop(cache[s], box, s)


if __name__ == "__main__":
    main()
