"""What the GPU check's steps share (benchmarks/GPU.md): their arguments, the device (or the
dry run's CPU), the photo set, long epochs, the peers' imports and the GPU's timing.

Every step runs on the CPU with ``--quick`` (the dry run, tests/test_gpu_suite.py): the
same code with small sizes, torchvision's compiled ops stubbed where they do not load
(``tests/refs.py``), and CUDA-only calls (events, streams, ``torch.cuda._sleep``) behind
the ``cuda`` branches below.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import gpu_photos
import torch
from common import ROOT, parser

import fastload as fl

QUICK_PHOTOS = 32  # the dry run's photo set: 4 batches of 8


def gpu_parser(description: str, workers: int = 14) -> Any:
    """common.parser (--quick, --data, --images, --json) plus --photos and --workers."""
    p = parser(description)
    p.set_defaults(images=8192)
    p.add_argument("--photos", default=None, help="a set built by gpu_photos.py (default: built under --data)")
    p.add_argument("--workers", type=int, default=workers, help=f"loader workers (default: {workers})")
    return p


def device_or_exit(args: Any, name: str) -> torch.device:
    """cuda; the CPU under --quick (the dry run). Without CUDA and --quick: says so and exits 0
    (``make bench`` runs every benchmark on the CPU)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if args.quick:
        torch.set_num_threads(1)  # on a busy machine, several threads per op spin against each other
        return torch.device("cpu")
    print(f"{name} needs a CUDA GPU (make gpu-check runs it on one); --quick runs it on the CPU")
    raise SystemExit(0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def photos(args: Any) -> tuple[str, list[str], list[int]]:
    """(root, relative paths, labels) of the photo set: --photos (built by the photos step),
    else one built here under --data (QUICK_PHOTOS of them with --quick)."""
    if args.photos:
        root = args.photos
        gpu_photos.check(root)
    else:
        n = QUICK_PHOTOS if args.quick else args.images
        root = gpu_photos.build(os.path.join(args.data, f"gpu-photos-{n}"), n, workers=2 if args.quick else None)
    paths, labels = gpu_photos.photo_list(root)
    return root, paths, labels


def repeat(items: list, n: int) -> list:
    """``items`` repeated to ``n`` (an epoch longer than the photo set: no run reaches its end,
    so no loader pays an epoch end inside a timed run)."""
    return (items * math.ceil(n / len(items)))[:n]


@contextlib.contextmanager
def feeding(loader: Any, batches: Iterator | None = None) -> Iterator[Iterator]:
    """``batches`` (default: a pass over ``loader``) for one run, everything ended after it:
    idle workers of an earlier run would go on making batches on the cores of the next."""
    batches = iter(loader) if batches is None else batches
    try:
        yield batches
    finally:
        if isinstance(batches, types.GeneratorType):
            batches.close()
        if isinstance(loader, fl.Loader):
            loader.close()
        del loader, batches
        gc.collect()  # DataLoader workers end when their iterator is freed


def import_peers(quick: bool) -> tuple[Any, Any]:
    """(torchvision, timm). Under --quick, torchvision's compiled ops are stubbed first (this
    machine's torchvision is a CUDA build beside a CPU torch: tests/refs.py)."""
    if quick:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import refs

        refs.stub_meta_registrations()
    import timm
    import timm.data
    import torchvision

    return torchvision, timm


def read_bytes(path: str) -> torch.Tensor:
    """A file's bytes as a uint8 tensor (torchvision.io.read_file without its compiled op)."""
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def jpeg_decoder(torchvision: Any, quick: bool, probe: str) -> Any:
    """torchvision.io.decode_jpeg to RGB (a DataLoader user's fastest CPU decode), tried on the
    JPEG ``probe``. Where its compiled op does not load (allowed under --quick only), Pillow
    stands in, said so."""
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(data: torch.Tensor) -> torch.Tensor:
        return decode_jpeg(data, mode=ImageReadMode.RGB)

    try:
        decode(read_bytes(probe))
    except RuntimeError as e:
        if not quick:
            raise
        print(f"torchvision.io.decode_jpeg does not run here ({str(e).splitlines()[0][:80]}): Pillow stands in")
        return pil_decode
    return decode


def pil_decode(data: torch.Tensor) -> torch.Tensor:
    """The dry run's stand-in for decode_jpeg: RGB uint8 C×H×W."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data.numpy().tobytes())) as img:
        return torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1)


class Clock:
    """Marks on the current stream (CUDA events), or host time on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def settle(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # once, after the timed loop: the events are read back
