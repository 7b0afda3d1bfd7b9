"""A deterministic, download-free sample dataset of photo-like JPEGs.

Each image is 1/f ("pink") noise, the power spectrum of natural photographs, plus
random shapes and a little sensor noise, so it compresses like a real photo
(several bits per pixel) rather than like a flat synthetic image.
"""

from __future__ import annotations

import os

import cv2
import numpy as np
from tqdm import tqdm


def photo_like(rng: np.random.Generator, height: int, width: int, tint: np.ndarray) -> np.ndarray:
    """An RGB uint8 image with natural-image statistics."""
    # Low frequencies carry almost all of a 1/f spectrum's power: synthesise at half
    # size and upsample (4x less FFT work); sensor noise below restores fine detail.
    sh, sw = (height + 1) // 2, (width + 1) // 2
    fy = np.fft.fftfreq(sh).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(sw).astype(np.float32)[None, :]
    amplitude = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(sh, sw)) ** 1.1
    planes = []
    for _ in range(3):
        spectrum = rng.standard_normal(amplitude.shape, dtype=np.float32) * amplitude + 1j * (
            rng.standard_normal(amplitude.shape, dtype=np.float32) * amplitude)
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


def make_sample_dataset(root: str, num_images: int = 320, num_classes: int = 8, seed: int = 0,
                        quality: int = 90, progress: bool = True) -> str:
    """Writes ``root/<class>/<n>.jpg`` (shorter side 256–512 px) unless already complete.

    Returns:
        ``root``.
    """
    if num_images < num_classes or num_classes < 1:
        raise ValueError(f"need num_classes >= 1 and num_images >= num_classes, got {num_images}, {num_classes}")
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return root
    tints = np.random.default_rng((seed, 1 << 20)).uniform(-1, 1, (num_classes, 3))
    for i in tqdm(range(num_images), desc=f"sample dataset → {root}", disable=not progress, unit="img"):
        rng = np.random.default_rng((seed, i))
        label = i % num_classes
        short = int(rng.integers(256, 513))
        long = int(short * rng.uniform(1.0, 1.5))
        h, w = (short, long) if rng.random() < 0.75 else (long, short)
        rgb = photo_like(rng, h, w, tints[label])
        ok, enc = cv2.imencode(".jpg", rgb[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
        assert ok
        folder = os.path.join(root, f"class_{label:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:05d}.jpg"), "wb") as f:
            f.write(enc.tobytes())
    open(marker, "w").close()
    return root
