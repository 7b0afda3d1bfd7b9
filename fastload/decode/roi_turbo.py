"""Region decode through libjpeg-turbo 3's TurboJPEG API: the crop's rows and columns only.

Where the system's libturbojpeg is libjpeg-turbo >= 3.0 (:mod:`fastload.decode.turbo`),
``tj3SetCroppingRegion`` decodes a crop's box the cheapest way libjpeg-turbo allows: rows
above it entropy-decoded only (``jpeg_skip_scanlines``), rows below it never read, and
columns outside it not transformed (``jpeg_crop_scanline``: the box widened to the iMCU
grid, and by one iMCU each side where fancy upsampling makes a cut edge differ). Its pixels
are the full decode's, cropped (``tests/test_decode_roi.py``). nvImageCodec's CPU backend
(:mod:`fastload.decode.roi`) decodes every column of the box's rows instead; measured in
``benchmarks/RESULTS.md`` ("Region decode at a DCT scale"): this one is the faster, so
:func:`fastload.decode.roi.get_region_decoder` takes it first, and it needs no extra.

Like nvImageCodec's, it never reads the data below the box, so it cannot see damage there:
it is planned only for bytes verified strictly before (:mod:`fastload.decode.plan`).

No pip wheel fastload can depend on carries this library: PyTurboJPEG ships none, and
simplejpeg, OpenCV, Pillow and nvImageCodec bundle libjpeg-turbo 3 without exporting the
TurboJPEG API (``benchmarks/RESULTS.md``). ``FASTLOAD_NO_SYSTEM_TURBOJPEG=1`` hides the
system library, and region decodes go to nvImageCodec.
"""

from __future__ import annotations

import os
import re
import threading
from fractions import Fraction

import numpy as np

from ._base import Buffer, DecodeError
from .header import read_header

_ONE = Fraction(1)
_lock = threading.Lock()
_checked: bool | None = None


def available() -> bool:
    """Whether the system's libturbojpeg is libjpeg-turbo >= 3.0 (and not hidden); checked once."""
    global _checked
    with _lock:
        if _checked is None:
            try:
                from .turbo import TurboJPEGDecoder

                _checked = TurboJPEGDecoder().strict_regions
            except (ImportError, OSError):
                _checked = False
        return _checked


def library_version(path: str) -> str | None:
    """The libjpeg-turbo version a library file states ("libjpeg-turbo version 3.1.2"), if it does."""
    try:
        with open(path, "rb") as f:
            found = re.search(rb"libjpeg-turbo version (\d+\.\d+\.\d+)", f.read())
    except OSError:
        return None
    return found.group(1).decode() if found else None


class TurboRegionDecoder:
    """Decodes a rectangle of a JPEG with libjpeg-turbo >= 3.0's TurboJPEG API (one handle per
    thread, :class:`fastload.decode.turbo.TurboJPEGDecoder`'s).

    Raises:
        OSError: The system's libturbojpeg is missing, hidden or older than 3.0.
    """

    name = "libjpeg-turbo-3"

    def __init__(self) -> None:
        from .turbo import LibraryProblem, TurboJPEGDecoder

        self._turbo = TurboJPEGDecoder()
        if not self._turbo.strict_regions:
            raise LibraryProblem("region decode through TurboJPEG needs libjpeg-turbo >= 3.0")
        self.library = self._turbo.library_file()
        self.version = library_version(self.library)

    def describe(self) -> str:
        """Name and library, e.g. "libjpeg-turbo-3 (libjpeg-turbo 3.1.2, /usr/lib/libturbojpeg.so.0.4.0)"."""
        return f"{self.name} (libjpeg-turbo {self.version or '?'}, {os.path.basename(self.library)})"

    def decode(self, data: Buffer, y0: int, x0: int, y1: int, x1: int) -> np.ndarray:
        """Rows y0:y1 and columns x0:x1 of the JPEG ``data`` as an RGB uint8 HWC array.

        The caller has checked the header (size, pixel limit, a complete JPEG).

        Raises:
            DecodeError: libjpeg-turbo cannot decode it.
        """
        header = read_header(data)
        if header.format != "jpeg" or header.components == 4:
            raise DecodeError(f"libjpeg-turbo region decode takes YCbCr or grey JPEGs, not {header.format}")
        img, (top, left) = self._turbo.decode_region(data, header, _ONE, y0, x0, x1, bottom=y1)
        out = img[y0 - top : y1 - top, x0 - left : x1 - left]
        if out.shape != (y1 - y0, x1 - x0, 3):
            raise DecodeError(f"libjpeg-turbo decoded {out.shape} for region ({y0}, {x0})-({y1}, {x1})")
        return out

    def decode_batch(self, datas: list[Buffer], regions: list[tuple[int, int, int, int]]) -> list[np.ndarray | None]:
        """The region (y0, x0, y1, x1) of each JPEG in ``datas``, one after the other (TurboJPEG
        has no batch call); None where one could not be decoded (:meth:`decode` says why)."""
        out: list[np.ndarray | None] = []
        for data, region in zip(datas, regions):
            try:
                out.append(self.decode(data, *region))
            except (DecodeError, ValueError):
                out.append(None)
        return out
