"""Region (ROI) decode of JPEGs: only the rows and columns a crop needs.

Two decoders, taken in this order (:func:`get_region_decoder`; ``fastload info`` names the one
that runs): libjpeg-turbo 3's TurboJPEG API where the system's libturbojpeg is >= 3.0
(:mod:`fastload.decode.roi_turbo`: only the box's rows and columns, the faster, measured in
``benchmarks/RESULTS.md``), else nvImageCodec's CPU backend, this module's :class:`RegionDecoder`.

Through nvImageCodec's CPU-only backend (``pip install 'fastload[roi]'``, the
``nvidia-nvimgcodec-cu12`` wheel; no GPU or CUDA needed). It runs libjpeg-turbo 3.1:
rows below the region are never read and rows above are entropy-decoded only
(``jpeg_skip_scanlines``), but the region's rows are decoded whole, all columns, and its
columns copied out (measured: a full-height strip 64 pixels wide costs a full decode).
Its pixels are those of a full decode, cropped (fancy upsampling and the islow IDCT,
as TurboJPEG's defaults).

What it does not do: DCT scaling (a region is decoded at full size), CMYK, and detect
damage as the strict decoders do. nvImageCodec fails on none of libjpeg's warnings about
corrupt entropy data (it decodes what libjpeg makes of them), and never reads the data
below the region (libjpeg-turbo's ``jpeg_skip_scanlines`` to the last row stops reading),
so a byte changed anywhere in the scan data goes unnoticed; ``benchmarks/bench_damage.py``
measures it. Only truncation is caught (the end-of-image check runs first). So
:mod:`fastload.decode.plan` plans region decodes only for bytes verified strictly before
(their checksum matches the one ``fastload verify`` or a converter's ``--verify`` recorded:
:mod:`fastload.verified`), or for every sample under the deprecated ``FASTLOAD_ROI=trusted``
(:func:`trusted`), and only for baseline 3-component JPEGs when its calibrated cost is lower.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
import threading

import numpy as np

from . import roi_turbo
from ._base import Buffer, DecodeError, as_array

EXTRA_HINT = "pip install 'fastload[roi]' (the nvidia-nvimgcodec-cu12 wheel; CPU only, no GPU needed)"

# nvImageCodec loads every codec extension on import and prints a line to stderr for
# each GPU library it cannot find (nvJPEG, nvJPEG2000, nvTIFF). Expected here: we ask
# for its CPU backend only.
_NOISE = (
    "Failed to load nvjpeg",
    "Failed to load nvtiff",
    "Failed to load nvjpeg2k",
    "Note: If using nvImageCodec",
    "[nvjpeg-ext]",
    "[nvjpeg2k_ext]",
    "[nvtiff_ext]",
)

_lock = threading.Lock()
_module = None
_failed: ImportError | None = None


def _import_quietly():
    """``nvidia.nvimgcodec``, its expected missing-GPU-library lines dropped from stderr."""
    # Errors only: a row a backend refuses is logged as a warning per image, and fastload
    # handles and counts those itself (decode="gpu": the GPU decoder's whole-image retry and
    # CPU fall-back). Read once, when the module initialises; a user's setting is kept.
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "1")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 2)
        try:
            from nvidia import nvimgcodec
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        lines = log.read().decode(errors="replace").splitlines()
    rest = [line for line in lines if line.strip() and not any(n in line for n in _NOISE)]
    if rest:
        print("\n".join(rest), file=sys.stderr)
    return nvimgcodec


def _interrupt(error: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit behind ``error``, if any: pybind11 turns one
    raised while its module initialises into an ImportError ("initialization failed")."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, (KeyboardInterrupt, SystemExit)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def module():
    """The nvImageCodec module, imported once per process.

    Raises:
        ImportError: It is not installed (the message names the extra to install).
    """
    global _module, _failed
    with _lock:
        if _module is None and _failed is None:
            try:
                _module = _import_quietly()
            except ImportError as e:
                interrupt = _interrupt(e)
                if interrupt is not None:  # not a missing library: the user pressed Ctrl-C
                    raise interrupt from None
                _failed = ImportError(f"region decode needs nvImageCodec: {EXTRA_HINT} ({e})")
        if _failed is not None:
            raise _failed
        return _module


def _off() -> bool:
    return os.environ.get("FASTLOAD_ROI", "1").strip().lower() in ("0", "false", "no", "off")


def available() -> bool:
    """Whether nvImageCodec's region decode can run here (installed, and not turned off by
    ``FASTLOAD_ROI=0``). :func:`region_available` asks for any region decoder."""
    if _off():
        return False
    try:
        module()
        return True
    except (ImportError, OSError, RuntimeError):
        return False


def region_available() -> bool:
    """Whether region decode can run here: a region decoder (libjpeg-turbo 3's TurboJPEG API or
    nvImageCodec, :func:`get_region_decoder`) is there, and ``FASTLOAD_ROI=0`` does not turn it off."""
    return not _off() and (roi_turbo.available() or available())


def trusted() -> bool:
    """Whether region decodes may be planned: ``FASTLOAD_ROI=trusted`` (the files are known
    intact: region decode cannot see corrupt data) and a region decoder is available."""
    return os.environ.get("FASTLOAD_ROI", "").strip().lower() == "trusted" and region_available()


def version() -> str | None:
    """nvImageCodec's version, or None where it is not available (or ``FASTLOAD_ROI=0``)."""
    return module().__version__ if available() else None


@functools.lru_cache(maxsize=1)
def bundled_libjpeg_turbo() -> str | None:
    """The libjpeg-turbo version inside nvImageCodec's CPU JPEG extension (e.g. "3.1.3"), or
    None where it cannot be told. For ``fastload info``: the file carries no version string,
    only its build's source paths (``.../libjpeg-turbo-3.1.3/...``), so they are read."""
    folder = os.path.join(os.path.dirname(module().__file__), "extensions")
    try:
        names = [n for n in os.listdir(folder) if n.startswith("libjpeg_turbo")]
        if not names:
            return None
        with open(os.path.join(folder, names[0]), "rb") as f:
            found = re.search(rb"libjpeg-turbo[-_](\d+\.\d+\.\d+)", f.read())
    except OSError:
        return None
    return found.group(1).decode() if found else None


def describe() -> str | None:
    """Which region decoder runs here: its name and library versions, e.g. "nvimgcodec-cpu
    (nvImageCodec 0.9.0, CPU backend, libjpeg-turbo 3.1.3 inside)"; None where none is available."""
    return get_region_decoder().describe() if region_available() else None


class RegionDecoder:
    """Decodes a rectangle of a JPEG; one nvImageCodec decoder per thread, each on the
    calling thread's core only (``max_num_cpu_threads=1``)."""

    name = "nvimgcodec-cpu"

    def __init__(self) -> None:
        self._nv = module()
        self._local = threading.local()
        self._params = self._nv.DecodeParams(apply_exif_orientation=False)  # as TurboJPEG

    def describe(self) -> str:
        """Name and library versions (for ``fastload info``)."""
        turbo = bundled_libjpeg_turbo()
        inside = f", libjpeg-turbo {turbo} inside" if turbo else ""
        return f"{self.name} (nvImageCodec {self._nv.__version__}, CPU backend{inside})"

    def _decoder(self):
        # Keyed by process too: a forked worker's main thread inherits the parent's
        # thread-local decoder, whose executor thread did not survive the fork.
        pid = os.getpid()
        held = getattr(self._local, "decoder", None)
        if held is None or held[0] != pid:
            nv = self._nv
            held = (
                pid,
                nv.Decoder(
                    device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                    max_num_cpu_threads=1,
                    backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
                ),
            )
            self._local.decoder = held
        return held[1]

    def decode(self, data: Buffer, y0: int, x0: int, y1: int, x1: int) -> np.ndarray:
        """Rows y0:y1 and columns x0:x1 of the JPEG ``data`` as an RGB uint8 HWC array.

        The caller has checked the header (size, pixel limit, a complete JPEG).

        Raises:
            DecodeError: nvImageCodec cannot decode it.
        """
        nv = self._nv
        try:
            stream = nv.CodeStream(as_array(data)).get_sub_code_stream(region=nv.Region(start=(y0, x0), end=(y1, x1)))
            img = self._decoder().decode(stream, params=self._params)
        except Exception as e:  # nvImageCodec raises RuntimeError/ValueError with its own text
            raise DecodeError(f"nvimgcodec cannot decode region ({y0}, {x0})-({y1}, {x1}): {e}") from e
        if img is None:
            raise DecodeError(f"nvimgcodec cannot decode region ({y0}, {x0})-({y1}, {x1}) (corrupt JPEG?)")
        out = np.asarray(img)  # a view that keeps the nvImageCodec image alive
        if out.shape != (y1 - y0, x1 - x0, 3):
            raise DecodeError(f"nvimgcodec decoded {out.shape} for region ({y0}, {x0})-({y1}, {x1})")
        return out

    def decode_batch(self, datas: list[Buffer], regions: list[tuple[int, int, int, int]]) -> list[np.ndarray | None]:
        """The region (y0, x0, y1, x1) of each JPEG in ``datas``, in one nvImageCodec call.

        Pixels are those :meth:`decode` gives. The caller has checked every header.

        Returns:
            One RGB uint8 HWC array per image, or None where that image could not be
            decoded (decode it alone with :meth:`decode` for the error).
        """
        nv = self._nv
        try:
            streams = [
                nv.CodeStream(as_array(d)).get_sub_code_stream(region=nv.Region(start=r[:2], end=r[2:]))
                for d, r in zip(datas, regions)
            ]
            images = self._decoder().decode(streams, params=self._params)
        except Exception:  # a stream nvImageCodec refuses outright: every image is tried alone
            return [None] * len(datas)
        out: list[np.ndarray | None] = []
        for img, (y0, x0, y1, x1) in zip(images, regions):
            a = None if img is None else np.asarray(img)
            out.append(a if a is not None and a.shape == (y1 - y0, x1 - x0, 3) else None)
        return out


_decoder: RegionDecoder | roi_turbo.TurboRegionDecoder | None = None


def get_region_decoder() -> RegionDecoder | roi_turbo.TurboRegionDecoder:
    """The process's region decoder: libjpeg-turbo 3's TurboJPEG API where the system has it
    (:mod:`fastload.decode.roi_turbo`, the faster), else nvImageCodec's CPU backend. Both give
    the full decode's pixels of the box and take the same calls (``decode``, ``decode_batch``,
    ``describe``, ``name``).

    Raises:
        ImportError: Neither is there (names the extra to install).
    """
    global _decoder
    if _decoder is None:
        d: RegionDecoder | roi_turbo.TurboRegionDecoder
        try:
            d = roi_turbo.TurboRegionDecoder() if roi_turbo.available() else RegionDecoder()
        except OSError:  # the library went away since it was checked
            d = RegionDecoder()
        with _lock:
            if _decoder is None:
                _decoder = d
    return _decoder
