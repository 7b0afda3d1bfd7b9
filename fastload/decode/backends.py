"""The decoder backends by name: their table, and one decoder of each per process.

The bottom of the registry: a backend named here is made (or refused, saying why) without
choosing a default, so :mod:`fastload.decode.costs` can time the backends it names and
:mod:`fastload.decode.registry` can choose the default from those timings, with no import
running back up from the timing to the choice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._base import Decoder
from .fallback import OpenCVDecoder, PillowDecoder
from .simple import SimpleJPEGDecoder
from .turbo import TurboJPEGDecoder

__all__ = ["BACKENDS", "JPEG_BACKENDS", "available", "named", "problem"]

BACKENDS = ("simplejpeg", "turbojpeg", "opencv", "pillow")
#: The strict libjpeg-turbo backends, in the order tried.
JPEG_BACKENDS = ("simplejpeg", "turbojpeg")

_MAKERS: dict[str, Callable[[], Decoder]] = {
    "simplejpeg": SimpleJPEGDecoder,
    "turbojpeg": TurboJPEGDecoder,
    "opencv": OpenCVDecoder,
    "pillow": PillowDecoder,
}
#: What to install when a backend's import fails; the libjpeg-turbo backends' own errors
#: already say what is wrong and how to fix it.
_HINTS = {
    "simplejpeg": "",
    "turbojpeg": "",
    "opencv": "; pip install opencv-python-headless",
    "pillow": "; pip install pillow",
}
_cache: dict[str, Decoder] = {}
_lock = threading.Lock()


def _make(name: str) -> Decoder:
    with _lock:
        if name not in _cache:
            _cache[name] = _MAKERS[name]()
        return _cache[name]


def problem(name: str) -> Exception | None:
    """Why backend ``name`` cannot be made here (its error), or None."""
    try:
        _make(name)
        return None
    except (ImportError, OSError, RuntimeError) as e:
        return e


def available(name: str) -> bool:
    """Whether backend ``name`` can be made here."""
    return problem(name) is None


def named(name: str) -> Decoder:
    """The decoder of backend ``name`` (one of :data:`BACKENDS`), made once per process.

    Raises:
        ValueError: ``name`` is not a backend.
        ImportError: The backend cannot be made here (the message says why and how to fix it).
    """
    if name not in _MAKERS:
        raise ValueError(f"unknown decoder backend {name!r}; choose from {BACKENDS}")
    try:
        return _make(name)
    except (ImportError, OSError, RuntimeError) as e:
        raise ImportError(f"decoder backend {name!r} is unavailable ({e}){_HINTS[name]}") from e
