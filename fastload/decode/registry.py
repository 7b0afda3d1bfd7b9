"""Decoders by name or the best here: :func:`get_decoder`, :func:`default_backend`, :func:`decode_image`.

The default backend is chosen from the backends that load (:mod:`fastload.decode.backends`)
and, where both libjpeg-turbo backends do, from their measured speed
(:mod:`fastload.decode.costs`); both lie below this module, so choosing imports nothing
that imports it back.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from ._base import MODULE_LIMIT, Buffer, Decoder, MaxPixels, resolve_max_pixels
from .backends import JPEG_BACKENDS, available, named, problem
from .costs import calibration_disabled, load_or_calibrate

__all__ = ["decode_image", "default_backend", "fallback_warning", "get_decoder"]

_warned = False
_default: Decoder | None = None  # get_decoder(None), resolved once per process


def fallback_warning(error: Exception | None) -> str:
    """The warning given when JPEGs are not decoded by libjpeg-turbo: its cause (``error``,
    why simplejpeg cannot load) and fix."""
    cause = str(error) if error is not None else "no libjpeg-turbo backend is available"
    return (
        f"fastload: decoding JPEG with OpenCV, which is slower and lets corrupt JPEG data that libjpeg only "
        f"warns about decode silently, because {cause}. (`fastload info` shows the decoders.)"
    )


def _measured_choice() -> str:
    """simplejpeg, unless the calibration (cached per machine) measured the system
    libturbojpeg faster by its margin; simplejpeg under FASTLOAD_NO_CALIBRATION=1."""
    if calibration_disabled():
        return "simplejpeg"
    choice = load_or_calibrate().get("backend", "simplejpeg")
    return choice if choice in JPEG_BACKENDS and available(choice) else "simplejpeg"


def default_backend() -> str:
    """The best backend that loads here (``FASTLOAD_DECODER`` overrides).

    simplejpeg where it is installed (fastload depends on it), the system libturbojpeg
    instead where both load and the calibration measured that one faster; without
    either, OpenCV (else Pillow), with a warning naming the cause, once per process.
    """
    global _warned
    forced = os.environ.get("FASTLOAD_DECODER")
    if forced:
        return forced
    if available("simplejpeg"):
        return _measured_choice() if available("turbojpeg") else "simplejpeg"
    if available("turbojpeg"):
        return "turbojpeg"
    if not _warned:
        _warned = True
        warnings.warn(fallback_warning(problem("simplejpeg")), RuntimeWarning, stacklevel=2)
    return "opencv" if available("opencv") else "pillow"


def get_decoder(name: str | None = None) -> Decoder:
    """Returns the decoder called ``name`` (one of BACKENDS), or the best available.

    Raises:
        ValueError: ``name`` is not a backend.
        ImportError: Backend ``name`` cannot be made here (the message says why and how to fix it).
    """
    global _default
    if name is not None:
        return named(name)
    if _default is None:
        _default = named(default_backend())
    return _default


def decode_image(
    data: Buffer, min_scale: float = 1.0, backend: str | None = None, *, max_pixels: MaxPixels = MODULE_LIMIT
) -> np.ndarray:
    """Decodes ``data`` to an RGB uint8 HWC array.

    Args:
        data: Encoded image bytes (JPEG, PNG, anything Pillow reads).
        min_scale: With a value below 1, JPEGs are decoded at the smallest DCT scale
            whose output is still at least ``ceil(side * min_scale)`` on each side.
        backend: One of BACKENDS; the best available when None.
        max_pixels: Refuse images with more pixels than this (read from the header,
            before decoding); None: no limit. By default ``fastload.decode.MAX_IMAGE_PIXELS``.

    Raises:
        DecodeError: The bytes are corrupt, truncated, not an image, or over the pixel
            limit. With the libjpeg-turbo backends (simplejpeg, turbojpeg), corrupt JPEG
            data that libjpeg only warns about is an error too (the message is libjpeg's).
    """
    return get_decoder(backend).decode(data, min_scale, max_pixels=resolve_max_pixels(max_pixels))
