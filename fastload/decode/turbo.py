"""JPEG through the system's libjpeg-turbo (libturbojpeg), called with ctypes so that a
libjpeg warning fails the call that caused it.

The default JPEG decoder is :mod:`fastload.decode.simple` (libjpeg-turbo bundled in
simplejpeg's wheel); this one is used where the system library is present and the
calibration measured it faster (:mod:`fastload.decode.costs`), or when asked for by
name. ``FASTLOAD_NO_SYSTEM_TURBOJPEG=1`` hides the system library (for tests of a
pip-only install).

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
import os
import platform
import threading
from ctypes import c_char_p, c_int, c_ulong, c_void_p
from fractions import Fraction

import numpy as np

from ._base import Buffer, DecodeError, as_array
from .libjpeg import SCALES, LibjpegTurboDecoder

__all__ = ["SCALES", "LibraryProblem", "TurboJPEGDecoder"]

TJPF_RGB = 0
TJFLAG_STOPONWARNING = 8192  # libjpeg-turbo >= 2.0; older versions ignore it
TJFLAG_FASTUPSAMPLE = 256  # chroma upsampled by replication, not libjpeg's triangle filter
NEEDED = ("tjInitDecompress", "tjDestroy", "tjDecompress2", "tjGetErrorStr")  # TurboJPEG 1.2+, kept by 3.x
INSTALL = (
    "sudo apt-get install libturbojpeg0 (Debian and Ubuntu; older Ubuntu releases name it "
    "libturbojpeg), sudo dnf install turbojpeg (Fedora), brew install jpeg-turbo (macOS)"
)


class LibraryProblem(OSError):
    """Why libjpeg-turbo's TurboJPEG library cannot be used, with the command that fixes it."""


def _library_path() -> str:
    if os.environ.get("FASTLOAD_NO_SYSTEM_TURBOJPEG", "").strip().lower() not in ("", "0", "false", "no"):
        raise LibraryProblem("the system libturbojpeg is hidden by FASTLOAD_NO_SYSTEM_TURBOJPEG=1")
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
        raise LibraryProblem(
            f"libturbojpeg at {path} is too old: it lacks {', '.join(missing)} (fastload needs "
            f"libjpeg-turbo >= 2.0); fix: upgrade it, e.g. sudo apt-get install --only-upgrade "
            "libturbojpeg0, or install libjpeg-turbo >= 2.0 from libjpeg-turbo.org"
        )
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


class TurboJPEGDecoder(LibjpegTurboDecoder):
    """The system's libturbojpeg (libjpeg-turbo >= 2.0), one handle per thread."""

    name = "turbojpeg"

    def __init__(self) -> None:
        super().__init__()
        self._lib = _load_library()
        self._error = getattr(self._lib, "tjGetErrorStr2", None)
        self._local = threading.local()

    def library_file(self) -> str:
        """The file of the loaded libturbojpeg (the linker may have found it by soname)."""
        name = self._lib._name
        if os.path.isabs(name):
            return os.path.realpath(name)
        with open("/proc/self/maps") as maps:  # Linux: where the loader mapped it
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith(name.split(".so")[0] + ".so"):
                    return os.path.realpath(path)
        raise OSError(f"cannot tell which file {name} was loaded from")

    def _handle(self) -> _Handle:
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _Handle(self._lib)
        return handle

    def _decode_jpeg(
        self, data: Buffer, h: int, w: int, scale: Fraction, fast_upsample: bool, out: np.ndarray | None
    ) -> np.ndarray:
        # Asked for exactly ceil(side * scale), tjDecompress2 picks that scale (the
        # largest whose output fits) and writes within this buffer.
        out = np.empty((h, w, 3), dtype=np.uint8) if out is None else out
        src = as_array(data)
        lib = self._lib
        handle = self._handle().ptr
        status = lib.tjDecompress2(
            handle,
            src.ctypes.data,
            src.size,
            out.ctypes.data,
            w,
            w * 3,
            h,
            TJPF_RGB,
            TJFLAG_STOPONWARNING | (TJFLAG_FASTUPSAMPLE if fast_upsample else 0),
        )
        if status != 0:
            message = self._error(handle) if self._error is not None else lib.tjGetErrorStr()
            raise DecodeError(f"libjpeg-turbo: {message.decode(errors='replace')}")
        return out
