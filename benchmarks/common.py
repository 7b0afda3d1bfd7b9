"""Helpers shared by the benchmarks: the photo dataset, timing, memory, reporting."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing

import torch  # noqa: E402

from fastload.photos.jpegs import format_jpeg_stats, jpeg_stats, make_photo_dataset  # noqa: E402
from fastload.system import available_cpus, cpu_model  # noqa: E402
from fastload.tune.measure import memory  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a few seconds, to check the benchmark still runs")
    p.add_argument("--data", default=os.path.join(ROOT, "data", "sample"), help="sample data folder")
    p.add_argument("--images", type=int, default=2000, help="photos in the benchmark dataset")
    p.add_argument("--json", default=None, help="append the result as one JSON line to this file")
    return p


def loader_parser(description: str, epochs: int = 3) -> argparse.ArgumentParser:
    """``parser`` plus the loader settings every throughput benchmark shares."""
    p = parser(description)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=available_cpus())
    p.add_argument("--epochs", type=int, default=epochs, help="timed epochs after a warm-up epoch")
    return p


def photo_folder(args, quiet: bool = False) -> str:
    """The real-photo dataset (fastload.photos.jpegs.make_photo_dataset): 48 photos with --quick.

    Prints its bits/pixel and size distribution unless ``quiet``.
    """
    n = 48 if args.quick else args.images
    root = make_photo_dataset(os.path.join(args.data, f"photos{n}"), num_images=n, num_classes=4 if args.quick else 10,
                              progress=not args.quick and sys.stderr.isatty(),
                              workers=1 if args.quick else available_cpus())
    if not quiet:
        print(format_jpeg_stats(jpeg_stats(root)))
    return root


def large_photos(root: str, count: int, seed: int = 0) -> str:
    """``count`` JPEGs of 2-8 MP in root/c0: each a canvas tiled with crops of scikit-image's
    colour photographs at native scale (no upscaling: real photo detail per pixel), some
    flipped, encoded 4:2:0 at quality 85-95. Made once; returns ``root``."""
    from PIL import Image

    from fastload.photos.bundled import source_photos

    folder = os.path.join(root, "c0")
    if os.path.isdir(folder) and len(os.listdir(folder)) >= count:
        return root
    os.makedirs(folder, exist_ok=True)
    sources = list(source_photos(gray=False).values())
    rng = np.random.default_rng(seed)
    for n in range(count):
        pixels = rng.uniform(2e6, 8e6)
        aspect = (4 / 3, 3 / 2, 3 / 4)[int(rng.integers(3))]
        h = int(np.sqrt(pixels / aspect)) // 16 * 16
        w = int(h * aspect) // 16 * 16
        canvas = np.empty((h, w, 3), np.uint8)
        y = 0
        while y < h:  # rows of tiles, each tile a crop of one photo at native scale
            th = int(rng.integers(250, 420))
            x = 0
            while x < w:
                src = sources[int(rng.integers(len(sources)))]
                sh, sw = src.shape[:2]
                tw = int(rng.integers(min(300, sw), sw + 1))
                ch, cw = min(th, sh, h - y), min(tw, w - x)
                y0, x0 = int(rng.integers(0, sh - ch + 1)), int(rng.integers(0, sw - cw + 1))
                tile = src[y0 : y0 + ch, x0 : x0 + cw]
                canvas[y : y + ch, x : x + cw] = tile[:, ::-1] if rng.random() < 0.5 else tile
                x += cw
            y += min(th, h - y)
        Image.fromarray(canvas).save(os.path.join(folder, f"{n:04d}.jpg"), "JPEG",
                                     quality=int(rng.integers(85, 96)), subsampling=2)
    return root


def photo_set_record(root: str) -> dict:
    """The dataset's statistics for a JSON report."""
    return {"root": root, **jpeg_stats(root)}


def machine() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cpus": available_cpus(), "gpu": gpu, "torch": torch.__version__,
            "python": platform.python_version()}


def median(values) -> float:
    return statistics.median(values)


def timed(fn, repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, all its threads (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU time so far of process ``root`` (this one by default) and all its descendants
    alive now: what a pipeline's main process and workers spent, however busy the
    machine (wall time on a machine shared with other jobs measures them too)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            total += cpu_seconds(pid)
        except (OSError, ValueError, IndexError):
            continue
        todo += children.get(pid, [])
    return total


def smaps_rollup() -> dict:
    """USS and PSS (bytes) of this process, from /proc/self/smaps_rollup."""
    return memory([os.getpid()])


def loader_rate(loader, epochs: int) -> float:
    """images/s over ``epochs`` epochs after a warm-up epoch (workers and buffers in place)."""
    for _ in loader:
        pass
    start, images = time.perf_counter(), 0
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        images += sum(y.shape[0] for _, y in loader)
    return images / (time.perf_counter() - start)


def report(name: str, args, result: dict) -> None:
    record = {"benchmark": name, "quick": bool(args.quick), "machine": machine(),
              "date": time.strftime("%Y-%m-%d"), **result}
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")
