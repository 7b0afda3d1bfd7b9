"""The operations the automatic augmentation policies choose among, with torchvision v2's
magnitude tables, shared by RandAugment, TrivialAugmentWide, AutoAugment and AugMix.

A *space* maps an operation name to (magnitudes(num_bins, height, width), signed): the
table of magnitudes a bin index picks from (None: the operation takes none) and whether
a draw flips its sign with probability 1/2. The tables are float32, computed as
``torch.linspace`` computes them, so a bin gives torchvision's exact magnitude.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import functional as F
from .functional._utils import Fill

Magnitudes = Callable[[int, int, int], "np.ndarray | None"]
Space = dict[str, tuple[Magnitudes, bool]]


def linspace32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32, to the bit: a float32 step, each value
    from the nearer end with one rounding (torch's fused multiply-add)."""
    s, e = np.float32(start), np.float32(end)
    step = np.float64((e - s) / np.float32(steps - 1)) if steps > 1 else 0.0
    idx = np.arange(steps)
    lo = (np.float64(s) + step * idx).astype(np.float32)
    hi = (np.float64(e) - step * (steps - 1 - idx)).astype(np.float32)
    return np.where(idx < steps // 2, lo, hi)


def _posterize_bits(top: int, span: int) -> Magnitudes:
    # torchvision: (top - arange(n) / ((n - 1) / span)).round().int(), in float32.
    def bits(n: int, h: int, w: int) -> np.ndarray:
        ramp = np.arange(n, dtype=np.float32) / np.float32((n - 1) / span)
        return np.round(np.float32(top) - ramp).astype(np.int64)

    return bits


def _lin(end: float) -> Magnitudes:
    return lambda n, h, w: linspace32(0.0, end, n)


def _none(n: int, h: int, w: int) -> None:
    return None


_SOLARIZE: Magnitudes = lambda n, h, w: linspace32(1.0, 0.0, n)

# RandAugment's and AutoAugment's space (AutoAugment adds Invert, drops Identity).
RAND_AUGMENT: Space = {
    "Identity": (_none, False),
    "ShearX": (_lin(0.3), True),
    "ShearY": (_lin(0.3), True),
    "TranslateX": (lambda n, h, w: linspace32(0.0, 150.0 / 331.0 * w, n), True),
    "TranslateY": (lambda n, h, w: linspace32(0.0, 150.0 / 331.0 * h, n), True),
    "Rotate": (_lin(30.0), True),
    "Brightness": (_lin(0.9), True),
    "Color": (_lin(0.9), True),
    "Contrast": (_lin(0.9), True),
    "Sharpness": (_lin(0.9), True),
    "Posterize": (_posterize_bits(8, 4), False),
    "Solarize": (_SOLARIZE, False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
AUTO_AUGMENT: Space = {**{k: v for k, v in RAND_AUGMENT.items() if k != "Identity"}, "Invert": (_none, False)}
TRIVIAL_AUGMENT_WIDE: Space = {
    "Identity": (_none, False),
    "ShearX": (_lin(0.99), True),
    "ShearY": (_lin(0.99), True),
    "TranslateX": (_lin(32.0), True),
    "TranslateY": (_lin(32.0), True),
    "Rotate": (_lin(135.0), True),
    "Brightness": (_lin(0.99), True),
    "Color": (_lin(0.99), True),
    "Contrast": (_lin(0.99), True),
    "Sharpness": (_lin(0.99), True),
    "Posterize": (_posterize_bits(8, 6), False),
    "Solarize": (_SOLARIZE, False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
AUGMIX_PARTIAL: Space = {
    "ShearX": (_lin(0.3), True),
    "ShearY": (_lin(0.3), True),
    "TranslateX": (lambda n, h, w: linspace32(0.0, w / 3.0, n), True),
    "TranslateY": (lambda n, h, w: linspace32(0.0, h / 3.0, n), True),
    "Rotate": (_lin(30.0), True),
    "Posterize": (_posterize_bits(4, 4), False),
    "Solarize": (_SOLARIZE, False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
AUGMIX_ALL: Space = {
    **AUGMIX_PARTIAL,
    "Brightness": (_lin(0.9), True),
    "Color": (_lin(0.9), True),
    "Contrast": (_lin(0.9), True),
    "Sharpness": (_lin(0.9), True),
}


@functools.lru_cache(maxsize=1024)
def _table(magnitudes_fn: Magnitudes, num_bins: int, h: int, w: int) -> np.ndarray | None:
    # A few image sizes recur (the crop size): the tables are built once each.
    return magnitudes_fn(num_bins, h, w)


def has_magnitude(space: Space, op: str) -> bool:
    """Whether ``op`` takes a magnitude (the policies draw a bin only for those)."""
    return space[op][0] is not _none


def signed_magnitude(
    space: Space, op: str, num_bins: int, index: int, h: int, w: int, rng: np.random.Generator
) -> float:
    """The magnitude of bin ``index`` for ``op`` (0.0 for operations without one), its sign
    flipped with probability 1/2 for signed operations (one draw from ``rng``, only then)."""
    magnitudes_fn, signed = space[op]
    magnitudes = _table(magnitudes_fn, num_bins, h, w)
    if magnitudes is None:
        return 0.0
    magnitude = float(magnitudes[index])
    if signed and rng.random() <= 0.5:
        magnitude = -magnitude
    return magnitude


def apply_op(img: np.ndarray, op: str, magnitude: float, interpolation: Any, fill: Fill) -> np.ndarray:
    """One operation at ``magnitude``, with torchvision's meaning of each magnitude."""
    if op == "Identity":
        return img
    if op in ("ShearX", "ShearY"):
        # torchvision shears by atan(magnitude) degrees about the top-left corner.
        angle = math.degrees(math.atan(magnitude))
        shear = [angle, 0.0] if op == "ShearX" else [0.0, angle]
        return F.affine(
            img,
            angle=0.0,
            translate=[0, 0],
            scale=1.0,
            shear=shear,
            interpolation=interpolation,
            fill=fill,
            center=[0, 0],
        )
    if op in ("TranslateX", "TranslateY"):
        translate = [int(magnitude), 0] if op == "TranslateX" else [0, int(magnitude)]
        return F.affine(
            img, angle=0.0, translate=translate, scale=1.0, shear=[0.0, 0.0], interpolation=interpolation, fill=fill
        )
    if op == "Rotate":
        return F.rotate(img, angle=magnitude, interpolation=interpolation, fill=fill)
    if op == "Brightness":
        return F.adjust_brightness(img, 1.0 + magnitude)
    if op == "Color":
        return F.adjust_saturation(img, 1.0 + magnitude)
    if op == "Contrast":
        return F.adjust_contrast(img, 1.0 + magnitude)
    if op == "Sharpness":
        return F.adjust_sharpness(img, 1.0 + magnitude)
    if op == "Posterize":
        return F.posterize(img, int(magnitude))
    if op == "Solarize":
        return F.solarize(img, 255.0 * magnitude)
    if op == "AutoContrast":
        return F.autocontrast(img)
    if op == "Equalize":
        return F.equalize(img)
    if op == "Invert":
        return F.invert(img)
    raise ValueError(f"no augmentation operation named {op!r}")
