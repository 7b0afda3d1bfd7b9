"""Encoded image bytes → RGB uint8 HWC arrays, with reduced-size (DCT-scaled) JPEG decode.

Backends, best first: PyTurboJPEG (JPEG only; other formats go to OpenCV or Pillow),
OpenCV, Pillow. All three release the GIL while decoding. Decoders are looked up by
name through :func:`get_decoder` so datasets pickle only the name.
"""

from __future__ import annotations

import io
import math
import os
import threading
import warnings
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

BACKENDS = ("turbojpeg", "opencv", "pillow")

_JPEG_SOI = b"\xff\xd8"
_PNG_SIG = b"\x89PNG\r\n\x1a\n"
# SOF markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) do not.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# libjpeg's own reduced sizes for OpenCV's IMREAD_REDUCED_* and Pillow's draft.
_POW2_SCALES = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1, 1))


class DecodeError(ValueError):
    """Raised when encoded bytes cannot be decoded into an image."""


Buffer = Any  # bytes, bytearray, memoryview or a uint8 numpy array


class Decoder(Protocol):
    name: str

    def decode(self, data: Buffer, min_scale: float = 1.0) -> np.ndarray: ...


def is_jpeg(data: Buffer) -> bool:
    return bytes(data[:2]) == _JPEG_SOI


def image_size(data: Buffer) -> tuple[int, int]:
    """(height, width) read from the header, without decoding pixels."""
    head = memoryview(data)
    if is_jpeg(head):
        return _jpeg_size(head)
    if bytes(head[:8]) == _PNG_SIG and len(head) >= 24:
        return int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big")
    try:
        from PIL import Image

        with Image.open(io.BytesIO(bytes(head))) as img:
            w, h = img.size
    except Exception as e:
        raise DecodeError(f"unrecognised image header: {e}") from e
    return h, w


def _jpeg_size(buf: memoryview) -> tuple[int, int]:
    i, n = 2, len(buf)
    while i + 4 <= n:
        if buf[i] != 0xFF:
            raise DecodeError(f"corrupt JPEG header: no marker at byte {i}")
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in _SOF_MARKERS:
            if i + 9 > n:
                break
            h = (buf[i + 5] << 8) | buf[i + 6]
            w = (buf[i + 7] << 8) | buf[i + 8]
            if h == 0 or w == 0:
                raise DecodeError(f"JPEG frame has zero size {w}x{h}")
            return h, w
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame
            break
        i += 2 + ((buf[i + 2] << 8) | buf[i + 3])
    raise DecodeError("truncated or corrupt JPEG header: no frame size found")


def _check_jpeg_complete(data: Buffer) -> None:
    # FFD9 cannot occur inside entropy-coded data (FF is always stuffed), so a JPEG
    # without EOI near its end was cut short; decoders would fill the rest with grey.
    tail = bytes(memoryview(data)[-4096:])
    if tail.rfind(b"\xff\xd9") < 0:
        raise DecodeError("truncated JPEG: no end-of-image marker")


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


def _as_array(data: Buffer) -> np.ndarray:
    return data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)


class PillowDecoder:
    name = "pillow"

    def __init__(self) -> None:
        from PIL import Image

        self._image = Image

    def decode(self, data: Buffer, min_scale: float = 1.0) -> np.ndarray:
        jpeg = is_jpeg(data)
        if jpeg:
            _check_jpeg_complete(data)
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

    def decode(self, data: Buffer, min_scale: float = 1.0) -> np.ndarray:
        cv2 = self._cv2
        scale = Fraction(1)
        if is_jpeg(data):
            _check_jpeg_complete(data)
            if min_scale < 1:
                h, w = _jpeg_size(memoryview(data))
                scale = reduced_scale(h, w, min_scale, _POW2_SCALES)
        img = cv2.imdecode(_as_array(data), self._flags[scale])
        if img is None:
            raise DecodeError("opencv cannot decode image (corrupt or unsupported format)")
        if scale != 1 or self._rgb is None:  # IMREAD_REDUCED_* decode to BGR
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        return img


class TurboJPEGDecoder:
    name = "turbojpeg"

    def __init__(self) -> None:
        import turbojpeg

        self._tj = turbojpeg.TurboJPEG()
        self._rgb = turbojpeg.TJPF_RGB
        self._cmyk = {turbojpeg.TJCS_CMYK, turbojpeg.TJCS_YCCK}
        self._scales = tuple(sorted(Fraction(n, d) for n, d in self._tj.scaling_factors if n <= d))
        self._other: Decoder | None = None

    def _fallback(self) -> Decoder:
        if self._other is None:
            self._other = _make("opencv") if _available("opencv") else _make("pillow")
        return self._other

    def decode(self, data: Buffer, min_scale: float = 1.0) -> np.ndarray:
        if not is_jpeg(data):
            return self._fallback().decode(data, min_scale)
        _check_jpeg_complete(data)
        _jpeg_size(memoryview(data))  # PyTurboJPEG only warns on a JPEG with no frame
        try:
            w, h, _, colorspace = self._tj.decode_header(data)
        except OSError as e:
            raise DecodeError(f"turbojpeg cannot read JPEG header: {e}") from e
        if w == 0 or h == 0:
            raise DecodeError("turbojpeg found no image in the JPEG data")
        if colorspace in self._cmyk:  # TurboJPEG cannot convert CMYK to RGB
            return _make("pillow").decode(data, min_scale)
        s = reduced_scale(h, w, min_scale, self._scales)
        factor = None if s == 1 else (s.numerator, s.denominator)
        try:
            return self._tj.decode(data, pixel_format=self._rgb, scaling_factor=factor)
        except OSError as e:
            raise DecodeError(f"turbojpeg cannot decode JPEG: {e}") from e


_MAKERS = {"turbojpeg": TurboJPEGDecoder, "opencv": OpenCVDecoder, "pillow": PillowDecoder}
_cache: dict[str, Decoder] = {}
_lock = threading.Lock()
_warned = False
_default: Decoder | None = None  # get_decoder(None), resolved once per process


def _make(name: str) -> Decoder:
    with _lock:
        if name not in _cache:
            _cache[name] = _MAKERS[name]()
        return _cache[name]


def _available(name: str) -> bool:
    try:
        _make(name)
        return True
    except (ImportError, OSError, RuntimeError):
        return False


def default_backend() -> str:
    """The best backend that loads here (``FASTLOAD_DECODER`` overrides)."""
    global _warned
    forced = os.environ.get("FASTLOAD_DECODER")
    if forced:
        return forced
    if _available("turbojpeg"):
        return "turbojpeg"
    if not _warned:
        _warned = True
        warnings.warn(
            "fastload: PyTurboJPEG or libjpeg-turbo is missing, decoding JPEG with OpenCV "
            "(slower). Install with `pip install PyTurboJPEG` and `apt-get install "
            "libturbojpeg0` (Debian/Ubuntu).",
            RuntimeWarning,
            stacklevel=2,
        )
    return "opencv" if _available("opencv") else "pillow"


def get_decoder(name: str | None = None) -> Decoder:
    """Returns the decoder called ``name`` (one of BACKENDS), or the best available."""
    global _default
    if name is None:
        if _default is None:
            _default = get_decoder(default_backend())
        return _default
    if name not in _MAKERS:
        raise ValueError(f"unknown decoder backend {name!r}; choose from {BACKENDS}")
    try:
        return _make(name)
    except (ImportError, OSError, RuntimeError) as e:
        hint = {
            "turbojpeg": "pip install PyTurboJPEG and apt-get install libturbojpeg0",
            "opencv": "pip install opencv-python-headless",
            "pillow": "pip install pillow",
        }[name]
        raise ImportError(f"decoder backend {name!r} is unavailable ({e}); {hint}") from e


def decode_image(data: Buffer, min_scale: float = 1.0, backend: str | None = None) -> np.ndarray:
    """Decodes ``data`` to an RGB uint8 HWC array.

    Args:
        data: Encoded image bytes (JPEG, PNG, anything Pillow reads).
        min_scale: With a value below 1, JPEGs are decoded at the smallest DCT scale
            whose output is still at least ``ceil(side * min_scale)`` on each side.
        backend: One of BACKENDS; the best available when None.

    Raises:
        DecodeError: The bytes are corrupt, truncated or not an image.
    """
    return get_decoder(backend).decode(data, min_scale)
