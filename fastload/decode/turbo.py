"""JPEG through libjpeg-turbo's TurboJPEG API, called with ctypes so that a libjpeg
warning fails the call that caused it.

libjpeg "warns" when entropy-coded data is corrupt and decodes on regardless, into
garbage or grey. PyTurboJPEG passes those warnings to ``warnings.warn``: printed once
per process, naming no file, and catchable only by changing the process-wide warning
filters, which many decoding threads cannot do safely. Here every call has its own
TurboJPEG handle, asks libjpeg to stop at the first warning (TJFLAG_STOPONWARNING) and
reads the message from that handle, so concurrent calls never see each other's errors.
Handles are kept one per thread (a fresh handle per call costs ~30 µs: libjpeg's memory
pools are allocated anew), so errors stay attributed to the call that caused them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import platform
import threading
from ctypes import c_char_p, c_int, c_ulong, c_void_p
from fractions import Fraction

import numpy as np

from ._base import POW2_SCALES, Buffer, DecodeError, Decoder, as_array, check_pixels, reduced_scale
from .header import ImageHeader, check_jpeg_complete, read_header

TJPF_RGB = 0
TJFLAG_STOPONWARNING = 8192  # libjpeg-turbo >= 2.0; older versions ignore it
TJFLAG_FASTUPSAMPLE = 256  # chroma upsampled by replication, not libjpeg's triangle filter
NEEDED = ("tjInitDecompress", "tjDestroy", "tjDecompress2", "tjGetErrorStr")  # TurboJPEG 1.2+, kept by 3.x
INSTALL = ("sudo apt-get install libturbojpeg0 (Debian and Ubuntu; older Ubuntu releases name it "
           "libturbojpeg), sudo dnf install turbojpeg (Fedora), brew install jpeg-turbo (macOS)")


class LibraryProblem(OSError):
    """Why libjpeg-turbo's TurboJPEG library cannot be used, with the command that fixes it."""


def _library_path() -> str:
    # PyTurboJPEG's search order: the linker's path, its list of usual places, LD_LIBRARY_PATH.
    path = ctypes.util.find_library("turbojpeg")
    if path:
        return path
    try:
        import turbojpeg  # PyTurboJPEG: only for its list of usual places

        candidates = list(getattr(turbojpeg, "DEFAULT_LIB_PATHS", {}).get(platform.system(), []))
    except ImportError:
        candidates = []
    candidates += [os.path.join(d, "libturbojpeg.so.0") for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    raise LibraryProblem(f"libjpeg-turbo's TurboJPEG library (libturbojpeg) is not installed; fix: {INSTALL}")


def _load_library() -> ctypes.CDLL:
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise LibraryProblem(f"libturbojpeg at {path} cannot be loaded ({e}); fix: reinstall it ({INSTALL})") from e
    missing = [name for name in NEEDED if not hasattr(lib, name)]
    if missing:
        raise LibraryProblem(f"libturbojpeg at {path} is too old: it lacks {', '.join(missing)} (fastload needs "
                             f"libjpeg-turbo >= 2.0); fix: upgrade it, e.g. sudo apt-get install --only-upgrade "
                             "libturbojpeg0, or install libjpeg-turbo >= 2.0 from libjpeg-turbo.org")
    lib.tjInitDecompress.argtypes = []
    lib.tjInitDecompress.restype = c_void_p
    lib.tjDestroy.argtypes = [c_void_p]
    lib.tjDestroy.restype = c_int
    lib.tjDecompress2.argtypes = [c_void_p, c_void_p, c_ulong, c_void_p, c_int, c_int, c_int, c_int, c_int]
    lib.tjDecompress2.restype = c_int
    if hasattr(lib, "tjGetErrorStr2"):  # per handle, libjpeg-turbo >= 2.0
        lib.tjGetErrorStr2.argtypes = [c_void_p]
        lib.tjGetErrorStr2.restype = c_char_p
    lib.tjGetErrorStr.argtypes = []
    lib.tjGetErrorStr.restype = c_char_p
    return lib


#: The DCT scales libjpeg-turbo decodes at: n/8 for n = 1..8.
SCALES = tuple(Fraction(n, 8) for n in range(1, 9))


class _Handle:
    """A TurboJPEG decompressor, destroyed with its thread's storage."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.ptr = lib.tjInitDecompress()
        if not self.ptr:
            raise MemoryError("tjInitDecompress failed")

    def __del__(self) -> None:
        if self.ptr:
            self.lib.tjDestroy(self.ptr)
            self.ptr = None


class TurboJPEGDecoder:
    name = "turbojpeg"
    scales = SCALES

    def __init__(self) -> None:
        self._lib = _load_library()
        self._error = getattr(self._lib, "tjGetErrorStr2", None)
        self._other: Decoder | None = None
        self._pillow: Decoder | None = None
        self._local = threading.local()

    def _handle(self) -> _Handle:
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _Handle(self._lib)
        return handle

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

    def decode(self, data: Buffer, min_scale: float = 1.0, *, header: ImageHeader | None = None,
               max_pixels: int | None = None, scale: Fraction | None = None,
               fast_upsample: bool = False) -> np.ndarray:
        """Decodes ``data``; JPEGs at the smallest power-of-2 DCT scale still ``min_scale``
        of each side, or at exactly ``scale`` (one of :data:`SCALES`) when given.
        ``fast_upsample``: chroma upsampled by replication (~8% faster on 4:2:0 photos,
        0.3 levels of 255 from the default after an antialiased resize)."""
        header = read_header(data) if header is None else header
        if header.format != "jpeg":
            return self._fallback().decode(data, min_scale, header=header, max_pixels=max_pixels)
        check_pixels(header, max_pixels)
        check_jpeg_complete(data)
        if header.components == 4:  # TurboJPEG cannot convert CMYK or YCCK to RGB
            return self._cmyk().decode(data, min_scale if scale is None else float(scale), header=header,
                                       max_pixels=max_pixels)
        s = reduced_scale(header.height, header.width, min_scale, POW2_SCALES) if scale is None else scale
        # libjpeg's scaled size: ceil(side * s). Asked for exactly that, tjDecompress2
        # picks scale s (the largest whose output fits) and writes within this buffer.
        h, w = math.ceil(header.height * s), math.ceil(header.width * s)
        out = np.empty((h, w, 3), dtype=np.uint8)
        src = as_array(data)
        lib = self._lib
        handle = self._handle().ptr
        status = lib.tjDecompress2(handle, src.ctypes.data, src.size, out.ctypes.data, w, w * 3, h,
                                   TJPF_RGB, TJFLAG_STOPONWARNING | (TJFLAG_FASTUPSAMPLE if fast_upsample else 0))
        if status != 0:
            message = self._error(handle) if self._error is not None else lib.tjGetErrorStr()
            raise DecodeError(f"libjpeg-turbo: {message.decode(errors='replace')}")
        return out
