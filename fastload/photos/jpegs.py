"""Download-free datasets: a real-photo ImageFolder for benchmarks and the demo, and a
synthetic noise generator for unit tests.

:func:`make_photo_dataset` cuts, rescales and recolours the real photographs that
scikit-image ships (:mod:`fastload.photos.bundled`) into JPEGs with ImageNet-like encoding
statistics: mostly 4:2:0 chroma, quality 75–95, shorter side 256–512 px, a few
progressive and grayscale files. :func:`jpeg_stats` measures what a folder holds.

:func:`photo_like` makes 1/f noise images (≈3 bits/pixel, far noisier than photos): fine for
tests, misleading for speed measurements.
"""

from __future__ import annotations

import io
import json
import math
import os

import cv2
import numpy as np
from tqdm import tqdm

MARKER = ".complete"
# Shares of the photo set's encodings (ImageNet: mostly baseline 4:2:0, some 4:4:4,
# a few progressive and grayscale files).
SUBSAMPLING = ((2, 0.87), (0, 0.09), (1, 0.04))  # Pillow codes: 2 = 4:2:0, 0 = 4:4:4, 1 = 4:2:2
PROGRESSIVE_SHARE = 0.04
GRAY_SHARE = 0.03
QUALITY = (75, 95)
SHORT_SIDE = (256, 512)
# IJG's base luminance quantization table; quality q scales it (libjpeg's jpeg_quality_scaling).
_IJG_LUMA = np.array(
    [
        16,
        11,
        10,
        16,
        24,
        40,
        51,
        61,
        12,
        12,
        14,
        19,
        26,
        58,
        60,
        55,
        14,
        13,
        16,
        24,
        40,
        57,
        69,
        56,
        14,
        17,
        22,
        29,
        51,
        87,
        80,
        62,
        18,
        22,
        37,
        56,
        68,
        109,
        103,
        77,
        24,
        35,
        55,
        64,
        81,
        104,
        113,
        92,
        49,
        64,
        78,
        87,
        103,
        121,
        120,
        101,
        72,
        92,
        95,
        98,
        112,
        100,
        103,
        99,
    ]
)


def _choose(rng: np.random.Generator, shares: tuple) -> object:
    values, weights = zip(*shares)
    return values[int(rng.choice(len(values), p=np.array(weights) / sum(weights)))]


def photo_jpeg(sources: list, rng: np.random.Generator) -> tuple[bytes, dict]:
    """One JPEG cut from a random source photo: crop, rescale, flip, colour shift, encode.

    Args:
        sources: RGB ``PIL.Image`` photographs to cut from.
        rng: Every choice is drawn from it, so the bytes depend on it alone (for a given
            Pillow / libjpeg build).

    Returns:
        (JPEG bytes, the encoding choices: quality, subsampling, progressive, gray).
    """
    from PIL import Image, ImageEnhance

    src = sources[int(rng.integers(len(sources)))]
    sw, sh = src.size
    short = int(rng.integers(SHORT_SIDE[0], SHORT_SIDE[1] + 1))
    long = int(round(short * math.exp(rng.uniform(0.0, math.log(1.5)))))
    ow, oh = (long, short) if rng.random() < 0.75 else (short, long)
    # A crop of 35–100% of the photo's area at the output's aspect ratio, anywhere in it.
    aspect = ow / oh
    cw = min(sw, math.sqrt(rng.uniform(0.35, 1.0) * sw * sh * aspect))
    ch = min(sh, cw / aspect)
    cw = min(sw, ch * aspect)
    x0, y0 = rng.uniform(0, max(sw - cw, 0.0)), rng.uniform(0, max(sh - ch, 0.0))
    img = src.resize((ow, oh), Image.Resampling.LANCZOS, box=(x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    # Mild colour shift: per-channel gain and a shared gamma through one lookup table, then saturation.
    gains, gamma = rng.uniform(0.92, 1.08, 3), rng.uniform(0.85, 1.18)
    ramp = (np.arange(256) / 255.0) ** gamma
    lut = np.concatenate([np.clip(np.rint(255 * g * ramp), 0, 255) for g in gains]).astype(np.uint8)
    img = ImageEnhance.Color(img.point(lut.tolist())).enhance(rng.uniform(0.8, 1.2))
    gray = rng.random() < GRAY_SHARE
    if gray:
        img = img.convert("L")
    choice = {
        "quality": int(rng.integers(QUALITY[0], QUALITY[1] + 1)),
        "subsampling": _choose(rng, SUBSAMPLING),
        "progressive": bool(rng.random() < PROGRESSIVE_SHARE),
        "gray": gray,
    }
    buf = io.BytesIO()
    img.save(
        buf, "JPEG", quality=choice["quality"], subsampling=choice["subsampling"], progressive=choice["progressive"]
    )
    return buf.getvalue(), choice


_sources: list | None = None  # a build worker's photographs, loaded once


def _load_sources() -> list:
    global _sources
    if _sources is None:
        from PIL import Image

        from .bundled import source_photos

        _sources = [Image.fromarray(a) for a in source_photos(gray=True).values()]
    return _sources


def _write_photo(job: tuple[str, int, int, int]) -> None:
    root, seed, i, num_classes = job
    data, _ = photo_jpeg(_load_sources(), np.random.default_rng((seed, i)))
    folder = os.path.join(root, f"class_{i % num_classes:02d}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{i:05d}.jpg"), "wb") as f:
        f.write(data)


def make_photo_dataset(
    root: str, num_images: int = 2000, num_classes: int = 10, seed: int = 0, progress: bool = False, workers: int = 1
) -> str:
    """Writes ``root/<class>/<n>.jpg`` from real photographs, deterministically, unless done.

    The images are crops, rescalings and mild colour shifts of scikit-image's bundled
    photographs, encoded by Pillow with ImageNet-like settings (see the module doc);
    on this project's photos they come to about 1–2.5 bits per pixel (``jpeg_stats``).
    A marker file holding the parameters is written last: a complete folder built with
    the same parameters is reused, one built with others is an error.

    Args:
        workers: Processes encoding at once (the files are the same for any number).

    Returns:
        ``root``.

    Raises:
        ValueError: Bad counts, or ``root`` holds a photo set built with other parameters.
        ImportError: scikit-image (the photographs) is not installed.
    """
    if num_classes < 1 or num_images < num_classes:
        raise ValueError(f"need num_classes >= 1 and num_images >= num_classes, got {num_images}, {num_classes}")
    params = {"kind": "photos", "version": 1, "num_images": num_images, "num_classes": num_classes, "seed": seed}
    marker = os.path.join(root, MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            found = f.read().strip()
        if found and json.loads(found) == params:
            return root
        raise ValueError(
            f"{root!r} holds a dataset built with other parameters ({found or 'synthetic'}); "
            f"use another folder or delete it"
        )
    _load_sources()  # fails here, not in a worker, without scikit-image
    jobs = [(root, seed, i, num_classes) for i in range(num_images)]
    bar = tqdm(total=num_images, desc=f"photo dataset → {root}", disable=not progress, unit="img")
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            for _ in pool.map(_write_photo, jobs, chunksize=16):
                bar.update()
    else:
        for job in jobs:
            _write_photo(job)
            bar.update()
    bar.close()
    with open(marker, "w") as f:
        json.dump(params, f)
    return root


def _ijg_tables() -> np.ndarray:
    q = np.arange(1, 101)[:, None]
    scale = np.where(q < 50, 5000 // q, 200 - 2 * q)
    return np.sort(np.clip((_IJG_LUMA[None, :] * scale + 50) // 100, 1, 255), axis=1)


_TABLES = _ijg_tables()  # row q-1: the sorted luminance table of IJG quality q


def jpeg_quality(luma_table) -> int:
    """The IJG quality (1–100) whose scaled luminance table is closest to ``luma_table``."""
    got = np.sort(np.asarray(luma_table, dtype=np.int64))
    return int(np.argmin(np.abs(_TABLES - got).sum(axis=1))) + 1


def jpeg_stats(root: str) -> dict:
    """Encoding statistics of the JPEGs under ``root``, read from their headers.

    Returns:
        ``images``; percentiles (p5, p25, p50, p75, p95) and mean of ``bits_per_pixel``,
        ``kb`` (file size) and ``short_side``; ``megapixels`` mean; shares of
        ``subsampling`` (4:2:0 / 4:2:2 / 4:4:4 / gray), ``progressive``; ``quality``
        percentiles (estimated from the quantization tables).
    """
    from PIL import Image, JpegImagePlugin

    bpp, kb, short, pixels, quality = [], [], [], [], []
    sampling = {"4:2:0": 0, "4:2:2": 0, "4:4:4": 0, "gray": 0, "other": 0}
    progressive = 0
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.lower().endswith((".jpg", ".jpeg")):
                continue
            path = os.path.join(folder, name)
            size = os.path.getsize(path)
            with Image.open(path) as img:
                w, h = img.size
                if img.mode == "L":
                    sampling["gray"] += 1
                else:
                    key = {2: "4:2:0", 1: "4:2:2", 0: "4:4:4"}.get(JpegImagePlugin.get_sampling(img), "other")
                    sampling[key] += 1
                progressive += bool(img.info.get("progressive"))
                quality.append(jpeg_quality(img.quantization[0]))
            bpp.append(8 * size / (w * h))
            kb.append(size / 1000)
            short.append(min(w, h))
            pixels.append(w * h)
    n = len(bpp)
    if n == 0:
        raise ValueError(f"no JPEG under {root!r}")

    def dist(values: list) -> dict:
        p = np.percentile(values, [5, 25, 50, 75, 95])
        return {"p5": p[0], "p25": p[1], "p50": p[2], "p75": p[3], "p95": p[4], "mean": float(np.mean(values))}

    return {
        "images": n,
        "bits_per_pixel": dist(bpp),
        "kb": dist(kb),
        "short_side": dist(short),
        "megapixels": float(np.mean(pixels)) / 1e6,
        "quality": dist(quality),
        "subsampling": {k: v / n for k, v in sampling.items() if v},
        "progressive": progressive / n,
    }


def format_jpeg_stats(stats: dict) -> str:
    """Two lines for a terminal or a report: bits/pixel, sizes and encodings."""
    b, k, s, q = stats["bits_per_pixel"], stats["kb"], stats["short_side"], stats["quality"]
    shares = ", ".join(f"{name} {share:.0%}" for name, share in stats["subsampling"].items())
    return (
        f"{stats['images']} JPEGs: bits/pixel median {b['p50']:.2f} (p5 {b['p5']:.2f}, p25 {b['p25']:.2f}, "
        f"p75 {b['p75']:.2f}, p95 {b['p95']:.2f}, mean {b['mean']:.2f}); file size median {k['p50']:.0f} KB "
        f"(p5 {k['p5']:.0f}, p95 {k['p95']:.0f}, mean {k['mean']:.0f})\n"
        f"shorter side median {s['p50']:.0f} px (p5 {s['p5']:.0f}, p95 {s['p95']:.0f}), "
        f"{stats['megapixels']:.2f} Mpixel mean; quality {q['p5']:.0f}–{q['p95']:.0f} (p5–p95); "
        f"{shares}; progressive {stats['progressive']:.0%}"
    )


# --- synthetic noise images, for unit tests ------------------------------------------------


def photo_like(rng: np.random.Generator, height: int, width: int, tint: np.ndarray) -> np.ndarray:
    """An RGB uint8 image of 1/f noise, shapes and sensor noise (synthetic: ≈3 bits/pixel as JPEG)."""
    # Low frequencies carry almost all of a 1/f spectrum's power: synthesise at half
    # size and upsample (4x less FFT work); sensor noise below restores fine detail.
    sh, sw = (height + 1) // 2, (width + 1) // 2
    fy = np.fft.fftfreq(sh).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(sw).astype(np.float32)[None, :]
    amplitude = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(sh, sw)) ** 1.1
    planes = []
    for _ in range(3):
        spectrum = rng.standard_normal(amplitude.shape, dtype=np.float32) * amplitude + 1j * (
            rng.standard_normal(amplitude.shape, dtype=np.float32) * amplitude
        )
        plane = np.fft.irfft2(spectrum, s=(sh, sw)).astype(np.float32)
        planes.append((plane - plane.mean()) / (plane.std() + 1e-9))
    img = cv2.resize(np.dstack(planes), (width, height), interpolation=cv2.INTER_CUBIC)
    img = 128 + 42 * img + 40 * tint.astype(np.float32)
    for _ in range(int(rng.integers(3, 9))):
        center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (int(rng.integers(4, max(5, width // 3))), int(rng.integers(4, max(5, height // 3))))
        color = tuple(float(v) for v in rng.uniform(0, 255, 3))
        cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, color, -1, cv2.LINE_AA)
    img += 4 * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)
