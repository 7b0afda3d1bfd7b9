"""What every decoder shares: the error, the protocol, the pixel limit and DCT scales."""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol, Union

import numpy as np

if TYPE_CHECKING:
    from .header import ImageHeader

Buffer = Any  # bytes, bytearray, memoryview or a uint8 numpy array

# The DCT scales libjpeg decodes fastest: libjpeg-turbo has SIMD code for 1/2, 1/4 and
# 1/8, while 3/8, 5/8, 3/4 and 7/8 run plain C and are slower than a full decode.
POW2_SCALES = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1, 1))


class DecodeError(ValueError):
    """Raised when encoded bytes cannot be decoded into an image."""


class Decoder(Protocol):
    name: str
    # The DCT scales the cost planner (fastload.decode.plan) may pick among for this decoder's
    # JPEGs, ascending; empty: the planner does not cost this decoder, which picks its own
    # power-of-2 scale from ``min_scale``.
    scales: tuple[Fraction, ...]

    def decode(
        self, data: Buffer, min_scale: float = 1.0, *, header: ImageHeader | None = None, max_pixels: int | None = None
    ) -> np.ndarray: ...


class ModuleLimit:
    """The default of the public ``max_pixels=`` arguments: ``MAX_IMAGE_PIXELS`` as it is
    when the image is decoded (so setting it at import time still works)."""

    def __repr__(self) -> str:
        return "fastload.decode.MAX_IMAGE_PIXELS"

    def __reduce__(self) -> str:
        return "MODULE_LIMIT"  # one object, also after pickling


MODULE_LIMIT = ModuleLimit()
MaxPixels = Union[int, None, ModuleLimit]  # what a public max_pixels= takes
# Decoders take ``max_pixels=None`` as "the module's limit"; no limit at all travels as an
# int no image's height × width reaches, so their checks need no third state.
NO_LIMIT = sys.maxsize


def resolve_max_pixels(max_pixels: MaxPixels) -> int | None:
    """A public ``max_pixels=`` (an int, None for no limit, or ``MODULE_LIMIT``) as decoders
    take it: the int, ``NO_LIMIT``, or None (the module's limit at decode time).

    Raises:
        TypeError, ValueError: ``max_pixels`` is not a positive int, None or ``MODULE_LIMIT``.
    """
    if isinstance(max_pixels, ModuleLimit):  # the one instance, MODULE_LIMIT
        return None
    if max_pixels is None:
        return NO_LIMIT
    check_max_pixels(max_pixels)
    return int(max_pixels)


def check_max_pixels(max_pixels: Any) -> None:
    """Raises unless ``max_pixels`` is None or a positive int."""
    if max_pixels is None:
        return
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, (int, np.integer)):
        raise TypeError(f"max_pixels must be a positive int or None, got {max_pixels!r}")
    if max_pixels <= 0:
        raise ValueError(f"max_pixels must be a positive int or None, got {max_pixels!r}")


def check_pixels(header: ImageHeader, max_pixels: int | None = None) -> None:
    """Raises DecodeError when the header's size is over the limit.

    The limit is ``max_pixels``, or ``fastload.decode.MAX_IMAGE_PIXELS`` when that is None.
    """
    # Read from the package at call time, so `fastload.decode.MAX_IMAGE_PIXELS = None`
    # works as Pillow's Image.MAX_IMAGE_PIXELS does.
    limit = max_pixels if max_pixels is not None else sys.modules[__package__].MAX_IMAGE_PIXELS
    if limit is not None and header.height * header.width > limit:
        raise DecodeError(
            f"image of {header.width}x{header.height} = {header.height * header.width:,} pixels "
            f"is over the limit of {limit:,} pixels (max_pixels / fastload.decode.MAX_IMAGE_PIXELS)"
        )


def reduced_scale(height: int, width: int, min_scale: float, scales: tuple[Fraction, ...]) -> Fraction:
    """The smallest DCT scale whose output is at least ``min_scale`` of each side.

    libjpeg rounds scaled sizes up, so comparing ``ceil(side * s)`` with the size asked
    for lets us take a smaller scale than comparing ``s`` with ``min_scale`` would.
    """
    if min_scale >= 1:
        return Fraction(1)
    need_h, need_w = math.ceil(height * min_scale - 1e-9), math.ceil(width * min_scale - 1e-9)
    for s in scales:  # ascending
        if math.ceil(height * s) >= need_h and math.ceil(width * s) >= need_w:
            return s
    return Fraction(1)


def as_array(data: Buffer) -> np.ndarray:
    """``data`` as a contiguous uint8 array (no copy unless it is a strided array)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    return np.frombuffer(data, dtype=np.uint8)
