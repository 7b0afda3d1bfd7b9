"""Real photographs that a pip package ships, for benchmarks, the demo and quality tests.

scikit-image's wheel carries a handful of photographs in ``skimage/data``. They are read
straight from the installed files (skimage itself is never imported, so its scientific
dependencies are not needed: ``pip install --no-deps scikit-image`` is enough).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

# Colour photographs of natural scenes; camera/moon/coins are grayscale photographs.
COLOUR = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "rocket.jpg",
    "retina.jpg",
    "ihc.png",
)
GRAY = ("camera.png", "moon.png", "coins.png")


def photo_dir() -> str:
    """The folder holding scikit-image's bundled photographs.

    Raises:
        ImportError: scikit-image is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("real photographs come from scikit-image's data files: pip install --no-deps scikit-image")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def source_photos(gray: bool = True) -> dict[str, np.ndarray]:
    """The bundled photographs by file name, as RGB uint8 H×W×3 (grayscale ones replicated)."""
    from PIL import Image

    folder = photo_dir()
    photos: dict[str, np.ndarray] = {}
    for name in COLOUR + (GRAY if gray else ()):
        with Image.open(os.path.join(folder, name)) as img:
            photos[name] = np.asarray(img.convert("RGB"))
    return photos
