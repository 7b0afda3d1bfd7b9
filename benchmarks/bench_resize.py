"""Resize candidates for the eval crop, timed on one core, and how far each is from Pillow.

The workload is ImageNet-like: scikit-image's bundled photographs and deterministic
rescalings of them to shorter sides of 256-512 px, as JPEG of quality 75-95. Each
candidate makes the 224x224 centre crop of the image resized to shorter side 256.
The reference is torchvision v1 on PIL: Pillow's antialiased bilinear ``resize`` to
shorter side 256, then the centre crop (torchvision's rounding). Quality is the mean
absolute difference from it in levels of 255: over all images, and the worst image's.

Resize-only rows start from the decoded pixels (reference: Pillow on the same pixels);
pipeline rows start from the JPEG bytes (reference: Pillow's own decode + resize). The
two decode-only rows show what failing on libjpeg's warnings costs: fastload's decoder
(header parsed once, TJFLAG_STOPONWARNING, a TurboJPEG handle per call) against
PyTurboJPEG's decode, which leaves warnings to ``warnings.warn``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from fastload import transforms as T  # noqa: E402
from fastload.decode import get_decoder, read_header  # noqa: E402
from fastload.photos import source_photos  # noqa: E402
from fastload.resize import resize, resize_window  # noqa: E402

SIZE, RESIZE = 224, 256


def photo_jpegs(per_photo: int, limit: int | None) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for img in list(source_photos().values())[:limit]:
        variants = [img]
        for _ in range(per_photo):
            s = int(rng.integers(256, 513)) / min(img.shape[:2])
            size = (max(1, round(img.shape[1] * s)), max(1, round(img.shape[0] * s)))
            variants.append(np.asarray(Image.fromarray(img).resize(size, Image.Resampling.LANCZOS)))
        for v in variants:
            buf = io.BytesIO()
            Image.fromarray(v).save(buf, format="JPEG", quality=int(rng.integers(75, 96)))
            out.append(buf.getvalue())
    return out


def geometry(h: int, w: int) -> tuple[int, int, int, int]:
    """(rh, rw, top, left): torchvision's Resize(256) size and CenterCrop(224) offsets."""
    rh, rw = (RESIZE, int(RESIZE * w / h)) if h <= w else (int(RESIZE * h / w), RESIZE)
    return rh, rw, int(round((rh - SIZE) / 2.0)), int(round((rw - SIZE) / 2.0))


def box(h: int, w: int) -> tuple[float, float, float, float]:
    """The eval crop in input pixels: (top, left, height, width)."""
    rh, rw, top, left = geometry(h, w)
    sy, sx = h / rh, w / rw
    return top * sy, left * sx, SIZE * sy, SIZE * sx


def rounded(img: np.ndarray) -> np.ndarray:
    top, left, ch, cw = box(*img.shape[:2])
    return img[round(top) : round(top + ch), round(left) : round(left + cw)]


def pillow_eval(img: Image.Image) -> np.ndarray:
    rh, rw, top, left = geometry(img.height, img.width)
    full = np.asarray(img.convert("RGB").resize((rw, rh), Image.Resampling.BILINEAR))
    return full[top : top + SIZE, left : left + SIZE]


# --- resize-only candidates: decoded pixels -> 224x224 ----------------------------------

def cv_linear(img):
    return cv2.resize(rounded(img), (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)


def cv_area(img):
    return cv2.resize(rounded(img), (SIZE, SIZE), interpolation=cv2.INTER_AREA)


def blur_linear(img):
    crop = rounded(img)
    s = crop.shape[0] / SIZE
    if s > 1:  # the usual pre-filter: a Gaussian of sigma (s - 1) / 2 input pixels
        sigma = (s - 1) / 2
        crop = cv2.GaussianBlur(crop, (0, 0), sigmaX=max(sigma, 1e-3))
    return cv2.resize(crop, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)


def pillow_aa(img):
    top, left, ch, cw = box(*img.shape[:2])
    return np.asarray(Image.fromarray(img).resize((SIZE, SIZE), Image.Resampling.BILINEAR,
                                                  box=(left, top, left + cw, top + ch)))


def pillow_reduce(img):
    top, left, ch, cw = box(*img.shape[:2])
    return np.asarray(Image.fromarray(img).resize((SIZE, SIZE), Image.Resampling.BILINEAR,
                                                  box=(left, top, left + cw, top + ch), reducing_gap=2.0))


def torch_interpolate(img):
    t = torch.from_numpy(np.ascontiguousarray(rounded(img))).permute(2, 0, 1).unsqueeze(0)
    out = torch.nn.functional.interpolate(t, size=(SIZE, SIZE), mode="bilinear", antialias=True)
    return out[0].permute(1, 2, 0).numpy()


def fastload_window(img):
    return resize_window(img, *box(*img.shape[:2]), SIZE, SIZE)


def fastload_rounded(img):
    return resize(rounded(img), SIZE, SIZE)


RESIZES = {
    "OpenCV INTER_LINEAR (no antialias)": cv_linear,
    "OpenCV INTER_AREA": cv_area,
    "Gaussian pre-blur + INTER_LINEAR": blur_linear,
    "Pillow antialiased bilinear (box=)": pillow_aa,
    "Pillow reduce + resize (reducing_gap=2)": pillow_reduce,
    "torch interpolate antialias (crop)": torch_interpolate,
    "fastload resize (crop then resize; train)": fastload_rounded,
    "fastload resize_window (exact; eval)": fastload_window,
}


# --- pipelines: JPEG bytes -> 224x224 -------------------------------------------------

def area_after_dct(dec):
    def run(data):
        hdr = read_header(data)
        rh, _, _, _ = geometry(hdr.height, hdr.width)
        img = dec.decode(data, rh / hdr.height)  # DCT scale giving >= the resize's size
        return cv_area(img)
    return run


def pipelines(dec) -> dict:
    presets = {"eval preset (antialias, default)": T.eval(SIZE), "eval preset antialias=False": T.eval(SIZE, antialias=False)}
    rows = {"full decode only (no resize)": lambda d: dec.decode(d)}
    try:  # the decode before libjpeg's warnings were checked, to show what checking costs
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        rows["PyTurboJPEG decode (warnings unchecked)"] = lambda d: tj.decode(d, pixel_format=turbojpeg.TJPF_RGB)
    except (ImportError, OSError, RuntimeError) as e:  # PyTurboJPEG raises RuntimeError without libturbojpeg
        print(f"(no PyTurboJPEG row: {str(e).splitlines()[0]})")
    rows["DCT-scale decode + INTER_AREA"] = area_after_dct(dec)
    rows.update({name: (lambda d, p=p: p.decode(d, dec, None)) for name, p in presets.items()})
    rng = np.random.default_rng(0)
    for name, p in (("train preset (antialias, default)", T.train(SIZE)), ("train preset antialias=False", T.train(SIZE, antialias=False))):
        rows[name] = lambda d, p=p: p.decode(d, dec, rng)
    return rows


def time_rows(rows: dict, inputs: list, repeat: int) -> dict:
    """Best µs per input for each row, interleaving rows so that drift hits all alike."""
    best = {name: np.full(len(inputs), np.inf) for name in rows}
    for fn in rows.values():  # warm-up: first calls load kernels and allocate
        fn(inputs[0])
    for _ in range(repeat):
        for i, x in enumerate(inputs):
            for name, fn in rows.items():
                start = time.perf_counter()
                fn(x)
                best[name][i] = min(best[name][i], time.perf_counter() - start)
    return {name: float(b.mean() * 1e6) for name, b in best.items()}


def quality(fn, inputs: list, refs: list) -> tuple[float, float]:
    diffs = [np.abs(fn(x).astype(np.int16) - r).mean() for x, r in zip(inputs, refs)]
    return float(np.mean(diffs)), float(np.max(diffs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few images, one timing pass (seconds)")
    p.add_argument("--json", default=None, help="append the result as one JSON line to this file")
    p.add_argument("--data", default=None, help="unused (the photos ship with scikit-image)")
    args = p.parse_args()
    torch.set_num_threads(1)  # one core, as in a loader worker
    cv2.setNumThreads(1)
    blobs = photo_jpegs(per_photo=1 if args.quick else 4, limit=4 if args.quick else None)
    dec = get_decoder()
    images = [dec.decode(b) for b in blobs]
    pixel_refs = [pillow_eval(Image.fromarray(img)) for img in images]
    jpeg_refs = [pillow_eval(Image.open(io.BytesIO(b))) for b in blobs]
    repeat = 1 if args.quick else 7

    rows = []
    speed = time_rows(RESIZES, images, repeat)
    for name, fn in RESIZES.items():
        rows.append({"candidate": name, "kind": "resize", "us": speed[name], **dict(zip(("mean", "worst"), quality(fn, images, pixel_refs)))})
    pipes = pipelines(dec)
    speed = time_rows(pipes, blobs, repeat)
    for name, fn in pipes.items():
        q = quality(fn, blobs, jpeg_refs) if name.startswith(("eval", "DCT")) else (math.nan, math.nan)
        rows.append({"candidate": name, "kind": "pipeline", "us": speed[name], "mean": q[0], "worst": q[1]})

    print(f"{len(blobs)} JPEGs (shorter sides 256-512 px), eval crop {SIZE} of resize {RESIZE}, one core")
    print(f"{'candidate':44s} {'us/image':>9s} {'mean':>6s} {'worst':>6s}   (levels of 255 from Pillow)")
    for kind, title in (("resize", "resize only, from decoded pixels:"), ("pipeline", "from JPEG bytes:")):
        print(title)
        for r in (r for r in rows if r["kind"] == kind):
            q = "     -      -" if math.isnan(r["mean"]) else f"{r['mean']:6.2f} {r['worst']:6.2f}"
            print(f"  {r['candidate']:42s} {r['us']:9.0f} {q}")
    if args.json:
        record = {"benchmark": "bench_resize", "quick": args.quick, "date": time.strftime("%Y-%m-%d"),
                  "machine": {"python": platform.python_version(), "torch": torch.__version__, "cv2": cv2.__version__},
                  "images": len(blobs), "rows": [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                                   for k, v in r.items()} for r in rows]}
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
