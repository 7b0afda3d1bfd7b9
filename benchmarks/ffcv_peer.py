"""FFCV 1.0.2's row of ``bench_handoff_peers.py``, run in FFCV's own venv (``make bench-ffcv``).

FFCV builds against Debian's OpenCV and libturbojpeg, and its venv holds numba and FFCV
beside the same CPU torch; fastload's venv does not import it. So the benchmark runs this
script with that venv's interpreter (``--ffcv-python``), one process per round, and reads the
one JSON line it prints. Nothing here imports fastload.

The pipeline, as FFCV's ImageNet example (``libffcv/ffcv-imagenet``, ``train_imagenet.py``)
builds its training loader, on the CPU: a ``.beton`` written once from the photo folder
(``DatasetWriter``: ``RGBImageField(write_mode='jpg', jpeg_quality=90)``, full size, and an
``IntField`` label; FFCV's writer decodes each photo and encodes it again, so the original
JPEG bytes cannot be kept: every photo is stored as a baseline JPEG at quality 90, FFCV's
default and its ImageNet example's), kept beside the set as ``ROOT.ffcv-jpg90.beton``; then
``Loader(beton, batch_size, num_workers=2, order=RANDOM, os_cache=True, drop_last=False)``
with ``RandomResizedCropRGBImageDecoder((224, 224))`` (libjpeg-turbo decode of the whole
photo, then the crop resized by OpenCV's INTER_AREA: antialiased) → ``RandomHorizontalFlip``
→ ``ToTensor`` → ``ToTorchImage`` (uint8 N×3×224×224, FFCV's default channels-last memory),
and ``IntDecoder`` → ``ToTensor`` → ``Squeeze`` for the labels. FFCV's workers are threads of
this process (numba's), so ``resource.getrusage`` of this process counts them. The example's
``QUASI_RANDOM`` order is for ``os_cache=False`` (FFCV refuses it with a cached file), and its
``ToDevice``/``NormalizeImage`` run on the GPU: both are left out as for every other row.

    python ffcv_peer.py --probe                      # {"ffcv": VERSION} or an error line
    python ffcv_peer.py ROOT --prepare                # writes the .beton once
    python ffcv_peer.py ROOT --batch-size 128 --workers 2 --later-epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from importlib.metadata import version

QUALITY = 90


def cpu_seconds() -> float:
    """CPU seconds of this process (its threads included) and of its children that ended."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def photos(root: str) -> tuple[list[str], list[int]]:
    """The set's JPEGs, sorted, and their class indices (their folders' names, sorted), as the benchmark lists them."""
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".jpg"))
    classes = sorted({os.path.basename(os.path.dirname(p)) for p in paths})
    return paths, [classes.index(os.path.basename(os.path.dirname(p))) for p in paths]


class PhotoFolder:
    """The indexed dataset FFCV's writer reads: (RGB Pillow image, label)."""

    def __init__(self, root: str) -> None:
        self.paths, self.labels = photos(root)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            return img.convert("RGB"), self.labels[i]


def beton_path(root: str) -> str:
    return os.path.abspath(root).rstrip(os.sep) + f".ffcv-jpg{QUALITY}.beton"


def prepare(root: str, workers: int) -> dict:
    """The set's .beton, written once beside it (through a temporary name: a stopped write leaves none)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    path, made = beton_path(root), False
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=QUALITY), "label": IntField()}
        DatasetWriter(tmp, fields, num_workers=workers).from_indexed_dataset(PhotoFolder(root))
        os.replace(tmp, path)
        made = True
    return {"beton": path, "beton_bytes": os.path.getsize(path), "written": made}


def make_loader(path: str, batch_size: int, workers: int):
    import torch  # noqa: F401  (FFCV's ToTensor hands torch tensors)
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    return Loader(
        path,
        batch_size=batch_size,
        num_workers=workers,
        order=OrderOption.RANDOM,
        os_cache=True,
        drop_last=False,
        pipelines={
            "image": [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        },
    )


def timed_epoch(make, wave: int, settle: float) -> tuple[object, dict]:
    """As ``bench_handoff_peers.timed_epoch``: images, wall and CPU seconds of one pass over
    ``make()`` (called inside the timing), and wall seconds and images at its first ``wave`` batches."""
    time.sleep(settle)
    start, cpu = time.perf_counter(), cpu_seconds()
    batches = make()
    images, arrivals, shape = 0, [], None
    for x, _ in batches:
        images += x.shape[0]
        shape = shape or [tuple(x.shape), str(x.dtype)]
        if len(arrivals) < wave:
            arrivals.append((time.perf_counter() - start, images))
    wall = time.perf_counter() - start
    return batches, {"images": images, "wall": wall, "cpu": cpu_seconds() - cpu, "arrivals": arrivals, "batch": shape}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", help="the photo folder (class folders of .jpg files)")
    p.add_argument("--probe", action="store_true", help="only print FFCV's version as JSON")
    p.add_argument("--prepare", action="store_true", help="only write the .beton (once) and print its path as JSON")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--later-epochs", type=int, default=2)
    p.add_argument("--wave", type=int, default=None, help="batches whose arrival is recorded (default: --workers)")
    p.add_argument("--settle", type=float, default=0.5, help="seconds slept before each timed epoch")
    args = p.parse_args()
    # Fails here, before anything is written, where FFCV does not import; imported before any timing.
    import ffcv.fields.rgb_image  # noqa: F401
    import ffcv.loader  # noqa: F401
    import ffcv.transforms  # noqa: F401

    if args.probe:
        print(
            json.dumps(
                {
                    "ffcv": version("ffcv"),
                    "python": sys.version.split()[0],
                    "numba": version("numba"),
                    "numpy": version("numpy"),
                    "torch": version("torch"),
                }
            )
        )
        return 0
    if not args.root:
        p.error("ROOT is required")
    info = prepare(args.root, args.workers)
    if args.prepare:
        print(json.dumps(info))
        return 0
    wave = args.wave or args.workers
    loader, first = timed_epoch(lambda: make_loader(info["beton"], args.batch_size, args.workers), wave, args.settle)
    later = [timed_epoch(lambda: loader, wave, args.settle)[1] for _ in range(args.later_epochs)]
    print(json.dumps({**info, "first": first, "later": later}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
