"""JPEG through simplejpeg: libjpeg-turbo 3 bundled in a wheel, so ``pip install`` is enough.

simplejpeg (MIT, wheels for Linux x86_64/aarch64, macOS and Windows) calls TurboJPEG's
``tjDecompress2`` with the GIL released, decodes into a caller's buffer, at any DCT
scale (``min_height``/``min_width``), and with ``strict=True`` raises on libjpeg's
warnings about corrupt data, after the decode (each call has its own TurboJPEG handle,
so concurrent calls never see each other's errors). Its messages are libjpeg's own.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ._base import Buffer, DecodeError, as_array
from .libjpeg import LibjpegTurboDecoder

INSTALL = "pip install simplejpeg (a dependency of fastload: reinstall fastload)"


class SimpleJPEGDecoder(LibjpegTurboDecoder):
    """libjpeg-turbo from simplejpeg's wheel.

    Raises:
        ImportError: simplejpeg is not installed (names the fix).
    """

    name = "simplejpeg"

    def __init__(self) -> None:
        super().__init__()
        try:
            import simplejpeg
        except ImportError as e:
            raise ImportError(f"simplejpeg is not installed ({e}); fix: {INSTALL}") from e
        self._decode = simplejpeg.decode_jpeg
        self.version = getattr(simplejpeg, "__version__", "?")

    def _decode_jpeg(
        self, data: Buffer, h: int, w: int, scale: Fraction, fast_upsample: bool, out: np.ndarray | None
    ) -> np.ndarray:
        # simplejpeg takes the smallest scale whose output is at least min_height x
        # min_width; asked for exactly ceil(side * scale), that is ``scale`` (on sides of
        # 8 or more; checked below). 0 leaves the image at full size.
        reduced = scale != 1
        try:
            img = self._decode(
                as_array(data),
                "rgb",
                fastupsample=fast_upsample,
                min_height=h if reduced else 0,
                min_width=w if reduced else 0,
                buffer=out,
                strict=True,
            )
        except ValueError as e:  # libjpeg's errors and, with strict, its warnings
            raise DecodeError(f"libjpeg-turbo: {e}") from e
        if img.shape != (h, w, 3):
            raise DecodeError(f"libjpeg-turbo decoded {img.shape} at scale {scale}, expected {(h, w, 3)}")
        return img
