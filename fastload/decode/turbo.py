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

With libjpeg-turbo >= 3.0 (TurboJPEG 3's ``tj3*`` functions), :meth:`TurboJPEGDecoder.decode_region`
decodes a crop strictly: the rows from the crop's top to the image's bottom, in the crop's
columns. libjpeg-turbo still entropy-decodes every block: the rows above are skipped by
``jpeg_skip_scanlines``, which runs the Huffman decoder over each of their MCUs
(``decode_mcu(cinfo, NULL)``), the columns outside by ``jpeg_crop_scanline``, whose
``decompress_onepass`` decodes every MCU of a row and transforms only the kept ones, and
reading on to the last row lets ``jpeg_finish_decompress`` read to the end-of-image
marker; a progressive file's scans are all decoded in ``jpeg_start_decompress``. With
``TJPARAM_STOPONWARNING`` the first corrupt-data warning fails the call, so it refuses
what the full strict decode refuses (``benchmarks/bench_damage.py``'s "strict region"
row). A region that stops above the bottom would not: skipping to the last row reads
nothing (``jpeg_skip_scanlines`` marks the end of input reached). Only IDCT, upsampling
and colour conversion are saved, for the rows above the crop and the columns beside it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
from ctypes import c_char_p, c_int, c_size_t, c_ulong, c_void_p
from fractions import Fraction

import numpy as np

from ._base import Buffer, DecodeError, as_array
from .header import ImageHeader
from .libjpeg import SCALES, LibjpegTurboDecoder, scaled_size

__all__ = ["SCALES", "LibraryProblem", "TurboJPEGDecoder"]

TJPF_RGB = 0
TJFLAG_STOPONWARNING = 8192  # libjpeg-turbo >= 2.0; older versions ignore it
TJFLAG_FASTUPSAMPLE = 256  # chroma upsampled by replication, not libjpeg's triangle filter
NEEDED = ("tjInitDecompress", "tjDestroy", "tjDecompress2", "tjGetErrorStr")  # TurboJPEG 1.2+, kept by 3.x
# TurboJPEG 3 (libjpeg-turbo >= 3.0): cropped decodes.
NEEDED_3 = (
    "tj3Init",
    "tj3Destroy",
    "tj3Set",
    "tj3Get",
    "tj3DecompressHeader",
    "tj3SetScalingFactor",
    "tj3SetCroppingRegion",
    "tj3Decompress8",
    "tj3GetErrorStr",
)
TJINIT_DECOMPRESS = 1
TJPARAM_STOPONWARNING, TJPARAM_SUBSAMP, TJPARAM_FASTUPSAMPLE = 0, 4, 9
# tjMCUWidth by TJSAMP (444, 422, 420, GRAY, 440, 411, 441): a cropped decode's left edge
# must fall on a multiple of it (scaled).
TJ_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)
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
    if all(hasattr(lib, name) for name in NEEDED_3):
        lib.tj3Init.argtypes = [c_int]
        lib.tj3Init.restype = c_void_p
        lib.tj3Destroy.argtypes = [c_void_p]
        lib.tj3Destroy.restype = None
        lib.tj3Set.argtypes = [c_void_p, c_int, c_int]
        lib.tj3Get.argtypes = [c_void_p, c_int]
        lib.tj3DecompressHeader.argtypes = [c_void_p, c_void_p, c_size_t]
        lib.tj3SetScalingFactor.argtypes = [c_void_p, _ScalingFactor]
        lib.tj3SetCroppingRegion.argtypes = [c_void_p, _Region]
        lib.tj3Decompress8.argtypes = [c_void_p, c_void_p, c_size_t, c_void_p, c_int, c_int]
        lib.tj3GetErrorStr.argtypes = [c_void_p]
        lib.tj3GetErrorStr.restype = c_char_p
    return lib


class _ScalingFactor(ctypes.Structure):
    _fields_ = [("num", c_int), ("denom", c_int)]


class _Region(ctypes.Structure):
    _fields_ = [("x", c_int), ("y", c_int), ("w", c_int), ("h", c_int)]


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


class _Handle3:
    """A TurboJPEG 3 decompressor that stops at libjpeg's first warning."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.ptr = lib.tj3Init(TJINIT_DECOMPRESS)
        if not self.ptr:
            raise MemoryError("tj3Init failed")
        lib.tj3Set(self.ptr, TJPARAM_STOPONWARNING, 1)

    def __del__(self) -> None:
        if self.ptr:
            self.lib.tj3Destroy(self.ptr)
            self.ptr = None


class TurboJPEGDecoder(LibjpegTurboDecoder):
    """The system's libturbojpeg (libjpeg-turbo >= 2.0), one handle per thread."""

    name = "turbojpeg"

    def __init__(self) -> None:
        super().__init__()
        self._lib = _load_library()
        self._error = getattr(self._lib, "tjGetErrorStr2", None)
        self._local = threading.local()
        #: Whether :meth:`decode_region` can run here (libjpeg-turbo >= 3.0).
        self.strict_regions = all(hasattr(self._lib, name) for name in NEEDED_3)

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

    def _handle3(self) -> _Handle3:
        handle = getattr(self._local, "handle3", None)
        if handle is None:
            handle = self._local.handle3 = _Handle3(self._lib)
        return handle

    def decode_region(
        self,
        data: Buffer,
        header: ImageHeader,
        scale: Fraction,
        top: int,
        left: int,
        right: int,
        fast_upsample: bool = False,
        out: np.ndarray | None = None,
        bottom: int | None = None,
    ) -> tuple[np.ndarray, tuple[int, int]]:
        """The rows ``top`` to the image's bottom and at least columns ``left`` to ``right``
        of the decode at DCT ``scale`` (in its pixels), strictly (see the module docstring).

        ``bottom``: stop at that row instead (exclusive). The rows below are then never read,
        so damage there goes unnoticed: only for bytes verified strictly before
        (:mod:`fastload.decode.roi_turbo`). The pixels are the same.

        The columns are widened to the iMCU grid and by one iMCU each side where the image
        goes on: libjpeg's fancy upsampling treats a cropped decode's side edges as the
        image's, so only pixels an iMCU in from them equal the full decode's. A JPEG only
        (check ``header.format``; CMYK is not decoded here).

        With ``out`` (a C-contiguous uint8 buffer of at least the whole decode's bytes), the
        region is written where it lies in the whole decode's layout and that whole-size
        view is returned, origin (0, 0): its pixels outside the region are undefined, so
        only code that reads within the region may use it (:func:`fastload.decode.plan.execute`).

        Returns:
            The RGB pixels and where they start, (row, column) in the decode at ``scale``.

        Raises:
            DecodeError: libjpeg refused the file, or warned about corrupt data in it.
            RuntimeError: The library is older than libjpeg-turbo 3.0 (``strict_regions``).
        """
        if not self.strict_regions:
            raise RuntimeError("decode_region needs libjpeg-turbo >= 3.0 (TurboJPEG 3)")
        lib, handle = self._lib, self._handle3().ptr
        src = as_array(data)
        full_h, full_w = scaled_size(header, scale)
        end = full_h if bottom is None else bottom
        if not (0 <= top < end <= full_h and 0 <= left < right <= full_w):
            raise ValueError(f"region rows {top}..{end} columns {left}..{right} outside a {full_w}x{full_h} decode")
        if lib.tj3DecompressHeader(handle, src.ctypes.data, src.size) != 0:
            raise DecodeError(f"libjpeg-turbo: {lib.tj3GetErrorStr(handle).decode(errors='replace')}")
        sub = lib.tj3Get(handle, TJPARAM_SUBSAMP)
        if not 0 <= sub < len(TJ_MCU_WIDTH):
            raise DecodeError(f"libjpeg-turbo: unknown chroma subsampling ({sub}) for a cropped decode")
        mcu = -(-TJ_MCU_WIDTH[sub] * scale.numerator // scale.denominator)
        x0 = max(0, left - mcu) // mcu * mcu
        x1 = min(full_w, right + mcu)
        lib.tj3Set(handle, TJPARAM_FASTUPSAMPLE, int(fast_upsample))
        lib.tj3SetScalingFactor(handle, _ScalingFactor(scale.numerator, scale.denominator))
        if lib.tj3SetCroppingRegion(handle, _Region(x0, top, x1 - x0, end - top)) != 0:
            raise DecodeError(f"libjpeg-turbo: {lib.tj3GetErrorStr(handle).decode(errors='replace')}")
        if out is None:
            pixels = whole = np.empty((end - top, x1 - x0, 3), np.uint8)
            origin, pitch = (top, x0), (x1 - x0) * 3
        else:
            if out.dtype != np.uint8 or not out.flags.c_contiguous or out.size < full_h * full_w * 3:
                raise ValueError(f"out must be a C-contiguous uint8 buffer of at least {full_h * full_w * 3} bytes")
            whole = out.reshape(-1)[: full_h * full_w * 3].reshape(full_h, full_w, 3)
            pixels, origin, pitch = whole[top:end, x0:x1], (0, 0), full_w * 3
        if lib.tj3Decompress8(handle, src.ctypes.data, src.size, pixels.ctypes.data, pitch, TJPF_RGB) != 0:
            raise DecodeError(f"libjpeg-turbo: {lib.tj3GetErrorStr(handle).decode(errors='replace')}")
        return whole, origin

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
