"""The OpenCV and Pillow decoders: every format they read, JPEG without libjpeg's warnings.

Both run libjpeg underneath but hide its warnings (corrupt entropy data that libjpeg
papers over): OpenCV lets libjpeg print the first one to stderr, Pillow drops them.
What they do catch: truncated JPEGs (checked here: no end-of-image marker), libjpeg's
fatal errors, and for other formats their libraries' own checks (libpng's CRCs in OpenCV).
"""

from __future__ import annotations

import io
import math
from fractions import Fraction

import numpy as np

from ._base import POW2_SCALES, Buffer, DecodeError, as_array, check_pixels, reduced_scale
from .header import ImageHeader, check_jpeg_complete, read_header


class PillowDecoder:
    name = "pillow"
    scales: tuple[Fraction, ...] = ()  # not costed: draft() picks the power-of-2 scale

    def __init__(self) -> None:
        from PIL import Image

        self._image = Image

    def decode(
        self, data: Buffer, min_scale: float = 1.0, *, header: ImageHeader | None = None, max_pixels: int | None = None
    ) -> np.ndarray:
        header = read_header(data) if header is None else header
        check_pixels(header, max_pixels)
        jpeg = header.format == "jpeg"
        if jpeg:
            check_jpeg_complete(data)
        try:
            with self._image.open(io.BytesIO(data)) as img:
                if jpeg and min_scale < 1:
                    # draft() picks the largest power-of-2 reduction still >= this size.
                    w, h = img.size
                    img.draft("RGB", (math.ceil(w * min_scale - 1e-9), math.ceil(h * min_scale - 1e-9)))
                rgb = img.convert("RGB") if img.mode != "RGB" else img
                rgb.load()
                return np.asarray(rgb)
        except DecodeError:
            raise
        except Exception as e:
            raise DecodeError(f"pillow cannot decode image: {e}") from e


class OpenCVDecoder:
    name = "opencv"
    scales: tuple[Fraction, ...] = ()  # not costed: IMREAD_REDUCED_* at the power-of-2 scale

    def __init__(self) -> None:
        import cv2

        self._cv2 = cv2
        # EXIF rotation off, as in the other backends and torchvision's loader.
        self._rgb = getattr(cv2, "IMREAD_COLOR_RGB", None)
        base = self._rgb if self._rgb is not None else cv2.IMREAD_COLOR
        self._flags = {
            Fraction(1): base | cv2.IMREAD_IGNORE_ORIENTATION,
            Fraction(1, 2): cv2.IMREAD_REDUCED_COLOR_2 | cv2.IMREAD_IGNORE_ORIENTATION,
            Fraction(1, 4): cv2.IMREAD_REDUCED_COLOR_4 | cv2.IMREAD_IGNORE_ORIENTATION,
            Fraction(1, 8): cv2.IMREAD_REDUCED_COLOR_8 | cv2.IMREAD_IGNORE_ORIENTATION,
        }

    def decode(
        self, data: Buffer, min_scale: float = 1.0, *, header: ImageHeader | None = None, max_pixels: int | None = None
    ) -> np.ndarray:
        cv2 = self._cv2
        header = read_header(data) if header is None else header
        check_pixels(header, max_pixels)
        scale = Fraction(1)
        if header.format == "jpeg":
            check_jpeg_complete(data)
            scale = reduced_scale(header.height, header.width, min_scale, POW2_SCALES)
        try:
            img = cv2.imdecode(as_array(data), self._flags[scale])
        except cv2.error as e:  # e.g. over OpenCV's own limit, CV_IO_MAX_IMAGE_PIXELS
            raise DecodeError(f"opencv cannot decode image: {e}") from e
        if img is None:
            raise DecodeError("opencv cannot decode image (corrupt or unsupported format)")
        if scale != 1 or self._rgb is None:  # IMREAD_REDUCED_* decode to BGR
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        return img
