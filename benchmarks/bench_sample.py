"""Per sample, in one process: ``ds[i]`` against a bare full decode + INTER_AREA resize of the crop.

The training preset (RandomResizedCrop 224 + flip, antialiased) on two photo sets: the
ImageNet-sized photo set (``fastload.photos.jpegs.make_photo_dataset``) and a set of 2-8 MP
photos (:func:`large_photos`: real photographs at native scale, tiled, quality 85-95).
One thread, CPU time of the process (``time.process_time``), rows interleaved sample by
sample in a rotating order, passes repeated; the median pass is printed.

Rows: ``ds[i]`` of a new dataset (its first pass: a sample's first decode ever, as in a
first epoch or an evaluation script), ``ds[i]`` in a later epoch, ``ds[i]`` with each switch a
user can flip (``reduced_decode=False``, ``FASTLOAD_ROI=trusted`` where nvImageCodec is
installed, ``FASTLOAD_NO_CALIBRATION=1``), the bare reference (simplejpeg's full decode, the
same crop cut out and resized with OpenCV's INTER_AREA, flipped) and the full decode alone,
both reading the file as ``ds[i]`` does.
The last lines print the ratios: default / bare (target >= 1.1), first pass / later pass
(>= 0.95), default / each switch (>= 0.97).

    python benchmarks/bench_sample.py                 # both sets
    python benchmarks/bench_sample.py --set large     # the 2-8 MP set only
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import cv2
import numpy as np
from common import parser, photo_folder, report

import fastload as fl
from fastload.datasets.base import sample_rng
from fastload.decode import costs, get_decoder, plan, read_header, roi


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


def bare(decoder, tf):
    """The bare reference: full decode, the crop cut out, INTER_AREA to 224, the flip."""
    crop_t = tf.transforms[0]

    def run(data: bytes, index: int) -> np.ndarray:
        rng = sample_rng(0, 0, index)
        img = decoder.decode(data)
        c = crop_t.plan(img.shape[0], img.shape[1], rng)
        y0, x0 = int(c.top), int(c.left)
        piece = img[y0 : y0 + int(c.height), x0 : x0 + int(c.width)]
        out = cv2.resize(piece, (c.out_w, c.out_h), interpolation=cv2.INTER_AREA)
        return out[:, ::-1] if rng.random() < 0.5 else out

    return run


def measure(root: str, limit: int, passes: int) -> dict:
    tf = fl.transforms.train(224)
    decoder = get_decoder()
    fitted = plan.get_planner().costs
    strict = plan.Planner(fitted, False)
    probe = fl.ImageFolder(root, transform=tf)
    # Evenly spread over the set (its classes are in order of index).
    idx = sorted({int(i) for i in np.linspace(0, len(probe) - 1, min(limit, len(probe))).round()})
    blobs = [probe.read(i)[0] for i in idx]
    headers = [read_header(b) for b in blobs]
    reference = bare(decoder, tf)
    # name -> (per-sample function, planner); each dataset is new, so its first pass is a first epoch.
    rows: dict = {}

    def dataset_row(name, planner, **options):
        ds = fl.ImageFolder(root, transform=fl.transforms.train(224, **options))
        rows[name] = (lambda i, ds=ds: ds.load(i, ds.epoch), planner, ds)

    dataset_row("ds[i], default", strict)
    dataset_row("ds[i], reduced_decode=False", strict, reduced_decode=False)
    if roi.available():
        dataset_row("ds[i], FASTLOAD_ROI=trusted (not strict)", plan.Planner(fitted, True))
    dataset_row("ds[i], FASTLOAD_NO_CALIBRATION=1", plan.Planner(costs.DEFAULT_COSTS, False))
    # The file read too, as ds[i] reads it (from the page cache after the first pass).
    rows["bare: full decode + INTER_AREA resize of the crop"] = (lambda i: reference(probe.read(i)[0], i), strict, None)
    rows["full decode alone"] = (lambda i: decoder.decode(probe.read(i)[0]), strict, None)
    names = list(rows)
    times: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, float] = {}
    for p in range(passes + 1):  # pass 0: every dataset's first pass (a first epoch)
        spent = dict.fromkeys(names, 0.0)
        for k, i in enumerate(idx):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                fn, planner, ds = rows[name]
                plan.set_planner(planner)
                if ds is not None:
                    ds.epoch = p
                t0 = time.process_time()
                fn(i)
                spent[name] += time.process_time() - t0
        for name in names:
            if p == 0:
                first[name] = spent[name] / len(idx) * 1e6
            else:
                times[name].append(spent[name] / len(idx) * 1e6)
    plan.set_planner(None)
    mp = float(np.mean([h.height * h.width for h in headers])) / 1e6
    return {"images": len(idx), "megapixels": mp, "kb": float(np.mean([len(b) for b in blobs])) / 1e3,
            "first_pass_us": first, "later_us": {n: statistics.median(v) for n, v in times.items()},
            "passes_us": times}


def show(title: str, r: dict) -> None:
    later, first = r["later_us"], r["first_pass_us"]
    default, ref = later["ds[i], default"], later["bare: full decode + INTER_AREA resize of the crop"]
    print(f"\n{title}: {r['images']} photos, {r['megapixels']:.2f} MP and {r['kb']:.0f} KB mean; CPU µs per "
          "sample, one thread (first pass | median later pass)")
    for name in later:
        print(f"  {name:52s} {first[name]:9.0f} | {later[name]:9.0f}")
    print(f"  default speed / bare full decode + INTER_AREA: {ref / default:.2f} (first pass "
          f"{first['bare: full decode + INTER_AREA resize of the crop'] / first['ds[i], default']:.2f}; target >= 1.1)")
    print(f"  default speed, first pass / later passes: {later['ds[i], default'] / first['ds[i], default']:.2f} "
          "(target >= 0.95)")
    for name in later:
        if name.startswith("ds[i], ") and name != "ds[i], default":
            print(f"  default speed / {name[7:]}: {later[name] / default:.2f} (target >= 0.97)")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--set", choices=("both", "photos", "large"), default="both")
    p.add_argument("--limit", type=int, default=300, help="photos measured per set")
    p.add_argument("--large", type=int, default=60, help="2-8 MP photos made")
    p.add_argument("--passes", type=int, default=3, help="later passes after the first")
    args = p.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    passes = 1 if args.quick else args.passes
    out = {}
    if args.set in ("both", "photos"):
        out["photos"] = measure(photo_folder(args, quiet=True), 24 if args.quick else args.limit, passes)
        show("ImageNet-sized photo set", out["photos"])
    if args.set in ("both", "large"):
        n = 4 if args.quick else args.large
        root = large_photos(os.path.join(args.data, f"large{n}"), n)
        out["large"] = measure(root, n, passes)
        show("2-8 MP photos (real photographs tiled at native scale)", out["large"])
    report("bench_sample", args, out)


if __name__ == "__main__":
    sys.exit(main())
