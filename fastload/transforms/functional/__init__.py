"""Augmentation operations on uint8 H×W×C (or H×W grayscale) numpy arrays, under the
names and parameters of ``torchvision.transforms.v2.functional``, with its pixels.

Pure functions: no randomness, no state. The random transforms in
:mod:`fastload.transforms` draw their parameters and call these. Point operations are
lookup tables (cv2.LUT); geometry and filtering are OpenCV calls. Flips and in-bounds
crops return views.
"""

from __future__ import annotations

from ._color import (
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    adjust_sharpness,
    autocontrast,
    equalize,
    invert,
    posterize,
    rgb_to_grayscale,
    solarize,
)
from ._geometry import affine, crop, hflip, horizontal_flip, pad, rotate, vertical_flip, vflip
from ._misc import gaussian_blur
from ._utils import interpolation_name

__all__ = [
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "adjust_sharpness",
    "affine",
    "autocontrast",
    "crop",
    "equalize",
    "gaussian_blur",
    "hflip",
    "horizontal_flip",
    "interpolation_name",
    "invert",
    "pad",
    "posterize",
    "rgb_to_grayscale",
    "rotate",
    "solarize",
    "vertical_flip",
    "vflip",
]
