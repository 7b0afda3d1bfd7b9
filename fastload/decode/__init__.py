"""Encoded image bytes → RGB uint8 HWC arrays, with reduced-size (DCT-scaled) JPEG decode.

Backends, best first: libjpeg-turbo 3 bundled in simplejpeg's wheel (``simplejpeg``, a
dependency, so pip alone gives it), the system's libturbojpeg (``turbojpeg``, used by
default only where present and measured faster by the calibration), OpenCV, Pillow. The
two libjpeg-turbo backends decode JPEG only (other formats go to OpenCV or Pillow) and
are strict: a JPEG that libjpeg calls corrupt is a DecodeError. All release the GIL
while decoding. Decoders are looked up by name through :func:`get_decoder` so datasets
pickle only the name.

Which decode serves a crop (full, a DCT scale n/8, or only the crop's region through the
optional nvImageCodec backend, ``fastload[roi]``) is chosen per sample by measured cost:
:mod:`fastload.decode.plan`, :mod:`fastload.decode.roi`.

Every decode reads the header first and refuses images over a pixel limit before any
pixel memory is allocated: ``max_pixels`` per call, else :data:`MAX_IMAGE_PIXELS`.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable

import numpy as np

from ._base import (
    MODULE_LIMIT,
    NO_LIMIT,
    Buffer,
    DecodeError,
    Decoder,
    MaxPixels,
    check_pixels,
    reduced_scale,
    resolve_max_pixels,
)
from .fallback import OpenCVDecoder, PillowDecoder
from .header import ImageHeader, image_size, is_jpeg, read_header
from .simple import SimpleJPEGDecoder
from .turbo import TurboJPEGDecoder

__all__ = [
    "BACKENDS",
    "JPEG_BACKENDS",
    "MAX_IMAGE_PIXELS",
    "MODULE_LIMIT",
    "NO_LIMIT",
    "DecodeError",
    "Decoder",
    "ImageHeader",
    "MaxPixels",
    "check_pixels",
    "decode_image",
    "default_backend",
    "get_decoder",
    "image_size",
    "is_jpeg",
    "read_header",
    "reduced_scale",
    "resolve_max_pixels",
]

BACKENDS = ("simplejpeg", "turbojpeg", "opencv", "pillow")
#: The strict libjpeg-turbo backends, in the order tried.
JPEG_BACKENDS = ("simplejpeg", "turbojpeg")

#: Images with more pixels than this fail with DecodeError before decoding (a JPEG of
#: 100 KB can claim 65500x65500). Pillow's default; None disables the check. Set it at
#: import time: worker processes started with "spawn" re-import this module. Per call
#: and per dataset, ``max_pixels=`` overrides it (``max_pixels=None``: no limit).
MAX_IMAGE_PIXELS: int | None = 89_478_485

_MAKERS: dict[str, Callable[[], Decoder]] = {
    "simplejpeg": SimpleJPEGDecoder,
    "turbojpeg": TurboJPEGDecoder,
    "opencv": OpenCVDecoder,
    "pillow": PillowDecoder,
}
_cache: dict[str, Decoder] = {}
_lock = threading.Lock()
_warned = False
_default: Decoder | None = None  # get_decoder(None), resolved once per process


def _make(name: str) -> Decoder:
    with _lock:
        if name not in _cache:
            _cache[name] = _MAKERS[name]()
        return _cache[name]


def _problem(name: str) -> Exception | None:
    """Why backend ``name`` cannot be made here (its error), or None."""
    try:
        _make(name)
        return None
    except (ImportError, OSError, RuntimeError) as e:
        return e


def _available(name: str) -> bool:
    return _problem(name) is None


def fallback_warning(problem: Exception | None) -> str:
    """The warning given when JPEGs are not decoded by libjpeg-turbo: its cause and fix."""
    cause = str(problem) if problem is not None else "no libjpeg-turbo backend is available"
    return (
        f"fastload: decoding JPEG with OpenCV, which is slower and lets corrupt JPEG data that libjpeg only "
        f"warns about decode silently, because {cause}. (`fastload info` shows the decoders.)"
    )


def _measured_choice() -> str:
    """simplejpeg, unless the calibration (cached per machine) measured the system
    libturbojpeg faster by its margin; simplejpeg under FASTLOAD_NO_CALIBRATION=1."""
    from .costs import calibration_disabled, load_or_calibrate

    if calibration_disabled():
        return "simplejpeg"
    choice = load_or_calibrate().get("backend", "simplejpeg")
    return choice if choice in JPEG_BACKENDS and _available(choice) else "simplejpeg"


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
    if _available("simplejpeg"):
        return _measured_choice() if _available("turbojpeg") else "simplejpeg"
    if _available("turbojpeg"):
        return "turbojpeg"
    if not _warned:
        _warned = True
        warnings.warn(fallback_warning(_problem("simplejpeg")), RuntimeWarning, stacklevel=2)
    return "opencv" if _available("opencv") else "pillow"


def get_decoder(name: str | None = None) -> Decoder:
    """Returns the decoder called ``name`` (one of BACKENDS), or the best available."""
    global _default
    if name is None:
        if _default is None:
            _default = get_decoder(default_backend())
        return _default
    if name not in _MAKERS:
        raise ValueError(f"unknown decoder backend {name!r}; choose from {BACKENDS}")
    try:
        return _make(name)
    except (ImportError, OSError, RuntimeError) as e:
        hint = {
            "simplejpeg": "",  # the errors say what is wrong and how to fix it
            "turbojpeg": "",
            "opencv": "; pip install opencv-python-headless",
            "pillow": "; pip install pillow",
        }[name]
        raise ImportError(f"decoder backend {name!r} is unavailable ({e}){hint}") from e


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
