"""The GPU check's photo set, built on the machine from the photographs that pip wheels ship.

scikit-image's wheel carries photographs in ``skimage/data`` and matplotlib's in
``matplotlib/mpl-data/sample_data``; both are on the GPU machine's image. They are read as
files (neither package is imported). Each JPEG is cut from one of them by
``fastload.photos.jpegs.photo_jpeg``: a crop, rescale to a shorter side of 256–512 px,
colour shift and ImageNet-like encoding (mostly 4:2:0, quality 75–95, a few progressive
and grayscale files), the bytes depending on (seed, index) alone. The files are written
by ``--workers`` forked processes (all cores by default: 16 on the GPU machine, where
8,192 photos take a few seconds), into ``root/class_NN/NNNNN.jpg``; a marker holding the
parameters is written last, so a complete set is reused and a different one refused.

    python benchmarks/gpu_photos.py --root data/gpu-photos --images 8192
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing

import numpy as np  # noqa: E402

from fastload.photos.bundled import COLOUR, GRAY  # noqa: E402
from fastload.photos.jpegs import format_jpeg_stats, jpeg_stats, photo_jpeg  # noqa: E402

# Package -> (its data folder, the photographs in it): scikit-image's that fastload bundles
# (fastload.photos.bundled) and matplotlib's portrait of Grace Hopper (512x600). Left out:
# matplotlib's 128x128 product shot (4x upscaled it is no photograph) and scikit-image's
# Hubble deep field (mostly black sky).
SOURCES = {
    "skimage": ("data", (*COLOUR, *GRAY)),
    "matplotlib": (os.path.join("mpl-data", "sample_data"), ("grace_hopper.jpg",)),
}
MARKER = ".complete"
CLASSES = 10
VERSION = 1  # of the recipe below: a set built by another version is rebuilt elsewhere, not reused


def source_paths() -> list[str]:
    """The photographs' files, found without importing their packages.

    Raises:
        FileNotFoundError: A package or one of its photographs is missing (named).
    """
    paths = []
    for package, (folder, names) in SOURCES.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"the photographs come from {package}'s wheel, which is not installed")
        base = os.path.join(list(spec.submodule_search_locations)[0], folder)
        for name in names:
            path = os.path.join(base, name)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{package} has no photograph {path}")
            paths.append(path)
    return paths


_sources: list = []  # this process's photographs (PIL images), loaded once


def _load() -> list:
    if not _sources:
        from PIL import Image

        for path in source_paths():
            with Image.open(path) as img:
                _sources.append(img.convert("RGB"))
    return _sources


def _write(job: tuple[str, int, int, int]) -> int:
    """Writes photos ``start .. stop-1``; returns how many."""
    root, seed, start, stop = job
    sources = _load()
    for i in range(start, stop):
        data, _ = photo_jpeg(sources, np.random.default_rng((seed, i)))
        folder = os.path.join(root, f"class_{i % CLASSES:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:05d}.jpg"), "wb") as f:
            f.write(data)
    return stop - start


def build(root: str, images: int, workers: int | None = None, seed: int = 0) -> str:
    """Writes the photo set into ``root`` unless a complete one with these parameters is there.

    Returns:
        ``root``.

    Raises:
        ValueError: ``images`` < 10, or ``root`` holds a set built with other parameters.
        FileNotFoundError: A source photograph is missing.
    """
    if images < CLASSES:
        raise ValueError(f"images must be at least {CLASSES}, got {images}")
    params = {"kind": "gpu-photos", "version": VERSION, "images": images, "classes": CLASSES, "seed": seed}
    marker = os.path.join(root, MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            found = json.load(f)
        if found != params:
            raise ValueError(f"{root!r} holds a photo set built with {found}, not {params}: delete it or use another")
        return root
    _load()  # a missing photograph fails here, once, before any process starts
    workers = max(1, min(workers or os.cpu_count() or 1, images))
    # Small jobs, many more than processes: all of them finish within a job of each other.
    chunk = max(1, min(64, images // (4 * workers)))
    jobs = [(root, seed, start, min(start + chunk, images)) for start in range(0, images, chunk)]
    if workers == 1:
        done = sum(map(_write, jobs))
    else:  # forked: the photographs loaded above are shared, nothing is imported again
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            done = sum(pool.map(_write, jobs))
    with open(marker, "w") as f:
        json.dump(params, f)
    assert done == images
    return root


def check(root: str) -> None:
    """Raises FileNotFoundError unless ``root`` holds a complete set (its marker written)."""
    if not os.path.exists(os.path.join(root, MARKER)):
        raise FileNotFoundError(f"no complete photo set in {root!r}: gpu_photos.py (the photos step) builds it")


def photo_list(root: str) -> tuple[list[str], list[int]]:
    """(paths relative to ``root``, labels) of a built set, in index order."""
    paths, labels = [], []
    for c in range(CLASSES):
        folder = f"class_{c:02d}"
        for name in os.listdir(os.path.join(root, folder)):
            paths.append(os.path.join(folder, name))
            labels.append(c)
    order = sorted(range(len(paths)), key=lambda i: paths[i].rsplit(os.sep, 1)[1])
    return [paths[i] for i in order], [labels[i] for i in order]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="the set's folder")
    p.add_argument("--images", type=int, default=8192)
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--json", default=None, help="append a record of the set to this file")
    args = p.parse_args(argv)
    start = time.perf_counter()
    build(args.root, args.images, args.workers)
    took = time.perf_counter() - start
    stats = jpeg_stats(args.root)
    workers = args.workers or os.cpu_count()
    print(f"{stats['images']} photos from {len(source_paths())} photographs in {args.root}: {took:.1f} s with "
          f"{workers} processes\n{format_jpeg_stats(stats)}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"benchmark": "photos", "root": args.root, "seconds": took, "workers": workers,
                                **stats}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
