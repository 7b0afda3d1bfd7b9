"""What the two libjpeg-turbo decoders share: header checks, DCT scales, output buffers.

:mod:`fastload.decode.simple` (simplejpeg's wheel, libjpeg-turbo bundled) and
:mod:`fastload.decode.turbo` (the system's libturbojpeg through ctypes) differ only in
how they call libjpeg-turbo; both are strict (a JPEG that libjpeg calls corrupt is a
:class:`DecodeError`), both decode at any DCT scale n/8, and both write into a caller's
buffer when given one (``out=``): a buffer reused per thread saves the page faults of a
fresh multi-megabyte array per image. Other formats go to OpenCV (else Pillow), CMYK
and YCCK JPEGs to Pillow (TurboJPEG cannot convert them to RGB).
"""

from __future__ import annotations

import threading
from fractions import Fraction

import numpy as np

from ._base import POW2_SCALES, Buffer, DecodeError, Decoder, check_pixels, reduced_scale
from .header import ImageHeader, check_jpeg_complete, read_header

#: The DCT scales libjpeg-turbo decodes at: n/8 for n = 1..8.
SCALES = tuple(Fraction(n, 8) for n in range(1, 9))

#: A per-thread scratch buffer over this size is not kept (one huge image would pin it).
MAX_SCRATCH = 64 << 20

_local = threading.local()


def scratch(nbytes: int) -> np.ndarray | None:
    """This thread's reusable uint8 buffer of at least ``nbytes`` (None over MAX_SCRATCH).

    Whatever is decoded into it is overwritten by the thread's next decode: callers copy
    out what they keep (:meth:`fastload.transforms.Compose.decode` resizes out of it).
    """
    if nbytes > MAX_SCRATCH:
        return None
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < nbytes:
        # Grown with headroom, so a run of slightly larger images reallocates rarely.
        buf = _local.buf = np.empty(min(MAX_SCRATCH, max(nbytes + nbytes // 4, 1 << 20)), np.uint8)
    return buf


def scaled_size(header: ImageHeader, scale: Fraction) -> tuple[int, int]:
    """libjpeg's output size at DCT scale ``scale``: ceil(side * scale)."""
    n, d = scale.numerator, scale.denominator  # integers: Fraction arithmetic is slow
    return -(-header.height * n // d), -(-header.width * n // d)


class LibjpegTurboDecoder:
    """Base of the libjpeg-turbo decoders: subclasses implement :meth:`_decode_jpeg`."""

    name = "libjpeg-turbo"
    scales = SCALES

    def __init__(self) -> None:
        self._other: Decoder | None = None
        self._pillow: Decoder | None = None

    def _fallback(self) -> Decoder:
        if self._other is None:
            from .fallback import OpenCVDecoder, PillowDecoder

            try:
                self._other = OpenCVDecoder()
            except ImportError:
                self._other = PillowDecoder()
        return self._other

    def _cmyk(self) -> Decoder:
        if self._pillow is None:
            from .fallback import PillowDecoder

            self._pillow = PillowDecoder()
        return self._pillow

    def decode(
        self,
        data: Buffer,
        min_scale: float = 1.0,
        *,
        header: ImageHeader | None = None,
        max_pixels: int | None = None,
        scale: Fraction | None = None,
        fast_upsample: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Decodes ``data`` to RGB uint8 HWC; JPEGs at the smallest power-of-2 DCT scale
        still ``min_scale`` of each side, or at exactly ``scale`` (one of :data:`SCALES`).

        ``fast_upsample``: chroma upsampled by replication (faster on 4:2:0 photos, 0.3
        levels of 255 from the default after an antialiased resize). ``out``: a C-contiguous
        uint8 buffer of at least height x width x 3 bytes that a JPEG is decoded into (the
        result is then a view of it); ignored for CMYK JPEGs and other formats.
        """
        header = read_header(data) if header is None else header
        if header.format != "jpeg":
            return self._fallback().decode(data, min_scale, header=header, max_pixels=max_pixels)
        check_pixels(header, max_pixels)
        if header.components == 4:
            return self._cmyk().decode(
                data, min_scale if scale is None else float(scale), header=header, max_pixels=max_pixels
            )
        s = reduced_scale(header.height, header.width, min_scale, POW2_SCALES) if scale is None else scale
        h, w = scaled_size(header, s)
        if out is not None:
            if out.dtype != np.uint8 or not out.flags.c_contiguous or out.size < h * w * 3:
                raise ValueError(
                    f"out must be a C-contiguous uint8 buffer of at least {h * w * 3} bytes, "
                    f"got {out.dtype} {out.shape}"
                )
            out = out.reshape(-1)[: h * w * 3].reshape(h, w, 3)
        try:
            return self._decode_jpeg(data, h, w, s, fast_upsample, out)
        except DecodeError:
            # libjpeg refuses a file cut short itself ("Premature end of JPEG file", a
            # warning, so an error here: benchmarks/bench_damage.py's "libjpeg's check
            # alone" row), so the end-of-image walk (0.5 ms on a 1.5 MB photo) runs only
            # to name that cause.
            check_jpeg_complete(data)
            raise

    def _decode_jpeg(
        self, data: Buffer, h: int, w: int, scale: Fraction, fast_upsample: bool, out: np.ndarray | None
    ) -> np.ndarray:
        """The h x w RGB decode of ``data`` (at ``scale``), into ``out`` when given."""
        raise NotImplementedError
