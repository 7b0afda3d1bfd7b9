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

from ._base import (
    MODULE_LIMIT,
    NO_LIMIT,
    DecodeError,
    Decoder,
    MaxPixels,
    check_pixels,
    reduced_scale,
    resolve_max_pixels,
)
from .backends import BACKENDS, JPEG_BACKENDS
from .header import ImageHeader, image_size, is_jpeg, read_header
from .registry import decode_image, default_backend, get_decoder

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

#: Images with more pixels than this fail with DecodeError before decoding (a JPEG of
#: 100 KB can claim 65500x65500). Pillow's default; None disables the check. Set it at
#: import time: worker processes started with "spawn" re-import this module. Per call
#: and per dataset, ``max_pixels=`` overrides it (``max_pixels=None``: no limit).
#: A setting, not registry state: it stays on the package, where users set it and where
#: :func:`fastload.decode._base.check_pixels` reads it at decode time.
MAX_IMAGE_PIXELS: int | None = 89_478_485
