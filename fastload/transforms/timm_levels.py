"""timm's op table: each op's magnitude-to-argument mapping and its image operation.

A magnitude (``m`` in ``rand-m9``) is a level on timm's 0–10 scale (``LEVEL_DENOM``); each
op maps it to its argument as timm 1.0's ``LEVEL_TO_ARG`` does, including the coin flip
that negates signed arguments (rotation, shear, translation, the "increasing" enhancements).
The op lists and weights of timm's policies are here too, under timm's names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import timm_ops as ops

LEVEL_DENOM = 10.0
# timm's ``_HPARAMS_DEFAULT``: what its policies use when built without the train transform.
DEFAULT_TRANSLATE_CONST = 250
DEFAULT_FILL = (128, 128, 128)


@dataclass(frozen=True)
class Hparams:
    """The image-dependent settings timm passes its ops (``hparams``).

    Attributes:
        translate_const: TranslateX/Y's pixels at level 10 (timm's train transform: 45% of
            the image size; 250 otherwise).
        translate_pct: TranslateX/YRel's fraction at level 10 (0.45; AugMix: 0.3).
        fill: The fill of uncovered pixels (timm: the mean, ``round(255 * mean)``).
        interpolation: ``"bilinear"``, ``"bicubic"``, or ``"random"`` (one of the two per
            op call, timm's default).
    """

    translate_const: float = DEFAULT_TRANSLATE_CONST
    translate_pct: float = 0.45
    fill: tuple[int, ...] = DEFAULT_FILL
    interpolation: str = "random"

    def __post_init__(self) -> None:
        if self.interpolation not in ("bilinear", "bicubic", "random"):
            raise ValueError(f"interpolation must be 'bilinear', 'bicubic' or 'random', got {self.interpolation!r}")


def _negate(v: float, rng: np.random.Generator) -> float:
    return -v if rng.random() > 0.5 else v


def _rotate(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (_negate(level / LEVEL_DENOM * 30.0, rng),)


def _enhance(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (level / LEVEL_DENOM * 1.8 + 0.1,)


def _enhance_increasing(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (max(0.1, 1.0 + _negate(level / LEVEL_DENOM * 0.9, rng)),)


def _minmax(lo: float, hi: float) -> Callable:
    def level_to_arg(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
        return (max(lo, min(hi, lo + (hi - lo) * level / LEVEL_DENOM)),)

    return level_to_arg


def _shear(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (_negate(level / LEVEL_DENOM * 0.3, rng),)


def _translate_abs(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (_negate(level / LEVEL_DENOM * float(hp.translate_const), rng),)


def _translate_rel(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (_negate(level / LEVEL_DENOM * hp.translate_pct, rng),)


def _posterize(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (int(level / LEVEL_DENOM * 4),)


def _posterize_increasing(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (4 - int(level / LEVEL_DENOM * 4),)


def _posterize_original(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (int(level / LEVEL_DENOM * 4) + 4,)


def _solarize(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (min(256, int(level / LEVEL_DENOM * 256)),)


def _solarize_increasing(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (256 - min(256, int(level / LEVEL_DENOM * 256)),)


def _solarize_add(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return (min(128, int(level / LEVEL_DENOM * 110)),)


def _none(level: float, hp: Hparams, rng: np.random.Generator) -> tuple:
    return ()


def _geometric(fn: Callable) -> Callable:
    """A geometric op called with the interpolation (drawn when "random") and the fill."""

    def apply(img: np.ndarray, arg: float, hp: Hparams, rng: np.random.Generator) -> np.ndarray:
        interp = hp.interpolation
        if interp == "random":
            interp = "bilinear" if rng.random() < 0.5 else "bicubic"
        return fn(img, arg, interp, hp.fill)

    return apply


def _point(fn: Callable) -> Callable:
    def apply(img: np.ndarray, *args) -> np.ndarray:
        return fn(img, *args[:-2])  # drop (hparams, rng)

    return apply


def _blur_rand(img: np.ndarray, factor: float, hp: Hparams, rng: np.random.Generator) -> np.ndarray:
    return ops.gaussian_blur(img, rng.uniform(0.1, 2.0 * factor))


def _desaturate(img: np.ndarray, factor: float, hp: Hparams, rng: np.random.Generator) -> np.ndarray:
    return ops.color(img, min(1.0, max(0.0, 1.0 - factor)))


@dataclass(frozen=True)
class OpSpec:
    """One op of timm's table: its level mapping and its operation ``f(img, *args, hparams, rng)``."""

    level_to_arg: Callable
    apply: Callable


_ROT, _SX, _SY = _geometric(ops.rotate), _geometric(ops.shear_x), _geometric(ops.shear_y)
_TX, _TY = _geometric(ops.translate_x), _geometric(ops.translate_y)


def _tx_rel(img: np.ndarray, pct: float, hp: Hparams, rng: np.random.Generator) -> np.ndarray:
    return _TX(img, pct * img.shape[1], hp, rng)


def _ty_rel(img: np.ndarray, pct: float, hp: Hparams, rng: np.random.Generator) -> np.ndarray:
    return _TY(img, pct * img.shape[0], hp, rng)


OPS: dict[str, OpSpec] = {
    "AutoContrast": OpSpec(_none, _point(ops.autocontrast)),
    "Equalize": OpSpec(_none, _point(ops.equalize)),
    "Invert": OpSpec(_none, _point(ops.invert)),
    "Rotate": OpSpec(_rotate, _ROT),
    "Posterize": OpSpec(_posterize, _point(ops.posterize)),
    "PosterizeIncreasing": OpSpec(_posterize_increasing, _point(ops.posterize)),
    "PosterizeOriginal": OpSpec(_posterize_original, _point(ops.posterize)),
    "Solarize": OpSpec(_solarize, _point(ops.solarize)),
    "SolarizeIncreasing": OpSpec(_solarize_increasing, _point(ops.solarize)),
    "SolarizeAdd": OpSpec(_solarize_add, _point(ops.solarize_add)),
    "Color": OpSpec(_enhance, _point(ops.color)),
    "ColorIncreasing": OpSpec(_enhance_increasing, _point(ops.color)),
    "Contrast": OpSpec(_enhance, _point(ops.contrast)),
    "ContrastIncreasing": OpSpec(_enhance_increasing, _point(ops.contrast)),
    "Brightness": OpSpec(_enhance, _point(ops.brightness)),
    "BrightnessIncreasing": OpSpec(_enhance_increasing, _point(ops.brightness)),
    "Sharpness": OpSpec(_enhance, _point(ops.sharpness)),
    "SharpnessIncreasing": OpSpec(_enhance_increasing, _point(ops.sharpness)),
    "ShearX": OpSpec(_shear, _SX),
    "ShearY": OpSpec(_shear, _SY),
    "TranslateX": OpSpec(_translate_abs, _TX),
    "TranslateY": OpSpec(_translate_abs, _TY),
    "TranslateXRel": OpSpec(_translate_rel, _tx_rel),
    "TranslateYRel": OpSpec(_translate_rel, _ty_rel),
    "Desaturate": OpSpec(_minmax(0.5, 1.0), _desaturate),
    "GaussianBlur": OpSpec(_minmax(0.1, 2.0), _point(ops.gaussian_blur)),
    "GaussianBlurRand": OpSpec(_minmax(0.0, 1.0), _blur_rand),
}

RAND_TRANSFORMS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
RAND_INCREASING_TRANSFORMS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
RAND_3A = ("SolarizeIncreasing", "Desaturate", "GaussianBlur")
RAND_WEIGHTED_3A = {
    "SolarizeIncreasing": 6,
    "Desaturate": 6,
    "GaussianBlur": 6,
    "Rotate": 3,
    "ShearX": 2,
    "ShearY": 2,
    "PosterizeIncreasing": 1,
    "AutoContrast": 1,
    "ColorIncreasing": 1,
    "SharpnessIncreasing": 1,
    "ContrastIncreasing": 1,
    "BrightnessIncreasing": 1,
    "Equalize": 1,
    "Invert": 1,
}
RAND_WEIGHTED_0 = {
    "Rotate": 3,
    "ShearX": 2,
    "ShearY": 2,
    "TranslateXRel": 1,
    "TranslateYRel": 1,
    "ColorIncreasing": 0.25,
    "SharpnessIncreasing": 0.25,
    "AutoContrast": 0.25,
    "SolarizeIncreasing": 0.05,
    "SolarizeAdd": 0.05,
    "ContrastIncreasing": 0.05,
    "BrightnessIncreasing": 0.05,
    "Equalize": 0.05,
    "PosterizeIncreasing": 0.05,
    "Invert": 0.05,
}
AUGMIX_TRANSFORMS = (
    "AutoContrast",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "Equalize",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
