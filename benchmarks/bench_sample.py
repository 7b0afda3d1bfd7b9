"""Per sample, in one process: ``ds[i]`` against a bare full decode + INTER_AREA resize of the crop.

The training preset (RandomResizedCrop 224 + flip, antialiased) on two photo sets: the
ImageNet-sized photo set (``fastload.photos.jpegs.make_photo_dataset``) and a set of 2-8 MP
photos (:func:`large_photos`: real photographs at native scale, tiled, quality 85-95).
One thread, CPU time of the process (``time.process_time``), rows interleaved sample by
sample in a shuffled order (each row follows every other one alike: a row run right after
FFmpeg's or Pillow's decode pays for the caches and heap they leave, ~300 µs on the photo
set), passes repeated; the median pass is printed. Each row runs once on a sample outside
the measured ones first (the process's own warm-up: imports, first calls of each
library), so the first pass measures samples decoded for the first time.

Rows: ``ds[i]`` of a new dataset (its first pass: a sample's first decode ever, as in a
first epoch or an evaluation script), ``ds[i]`` in a later epoch, ``ds[i]`` with each switch a
user can flip (``reduced_decode=False``, ``FASTLOAD_ROI=trusted`` where nvImageCodec is
installed, ``FASTLOAD_NO_CALIBRATION=1``, ``decoder='turbojpeg'`` where the system has
libturbojpeg: with libjpeg-turbo >= 3 its strict region decodes), the bare reference
(simplejpeg's full decode, the same crop cut out and resized with OpenCV's INTER_AREA,
flipped), the full decode alone and the decode at DCT scale 1/8 alone (the strict floor:
libjpeg-turbo entropy-decodes every block at any scale, and at 1/8 does little else), each
reading the file as ``ds[i]`` does; and the peers per sample, where installed: timm-style
(``Image.open().convert('RGB')``, RandomResizedCrop's Pillow crop and bilinear resize, flip,
to tensor) and SPDL (FFmpeg decode, crop, scale and flip in one filter graph). DALI works on
batches (its per-sample figure is its hand-off rate, ``bench_loader.py``); FFCV does not
install here (``peers.py``).
The last lines print the ratios: default / bare (target >= 1.1), first pass / later pass
(>= 0.95), default / each switch (>= 0.97), default / each peer, and the floor.

    python benchmarks/bench_sample.py                 # both sets
    python benchmarks/bench_sample.py --set large     # the 2-8 MP set only
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from fractions import Fraction

import cv2
import numpy as np
from common import large_photos, parser, photo_folder, report
from peers import TimmDataset, spdl_train_sample, spdl_version

import fastload as fl
from fastload.datasets.base import sample_rng
from fastload.decode import costs, get_decoder, plan, read_header, roi

FLOOR = "decode at DCT scale 1/8 alone (the strict floor)"


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
        rows[name] = (lambda i, ds=ds: ds[i], planner, ds)  # as a user calls it: a contiguous array

    dataset_row("ds[i], default", strict)
    dataset_row("ds[i], reduced_decode=False", strict, reduced_decode=False)
    if roi.available():
        dataset_row("ds[i], FASTLOAD_ROI=trusted (not strict)", plan.Planner(fitted, True))
    dataset_row("ds[i], FASTLOAD_NO_CALIBRATION=1", plan.Planner(costs.DEFAULT_COSTS, False))
    try:
        turbo = get_decoder("turbojpeg")
        regions = " (TurboJPEG 3 strict regions)" if turbo.strict_regions else ""
        ds = fl.ImageFolder(root, transform=fl.transforms.train(224), decoder="turbojpeg")
        rows[f"ds[i], decoder='turbojpeg'{regions}"] = (lambda i, ds=ds: ds[i], strict, ds)
    except ImportError:
        pass
    # The file read too, as ds[i] reads it (from the page cache after the first pass).
    rows["bare: full decode + INTER_AREA resize of the crop"] = (lambda i: reference(probe.read(i)[0], i), strict, None)
    rows["full decode alone"] = (lambda i: decoder.decode(probe.read(i)[0]), strict, None)
    rows[FLOOR] = (lambda i: decoder.decode(probe.read(i)[0], scale=Fraction(1, 8)), strict, None)
    timm = TimmDataset([probe.path(i) for i in range(len(probe))], list(probe.labels), True)
    rows["peer: timm-style (Pillow) __getitem__"] = (lambda i: timm[i], strict, None)
    if spdl_version() is not None:
        rows[f"peer: SPDL {spdl_version()} (FFmpeg decode, crop, scale, flip)"] = (
            lambda i: spdl_train_sample(probe.read(i)[0]), strict, None)
    names = list(rows)
    spare = [i for i in range(len(probe)) if i not in set(idx)][:1] or idx[:1]
    for name in names:  # the process's warm-up, on a sample not measured
        fn, planner, _ = rows[name]
        plan.set_planner(planner)
        fn(spare[0])
    times: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, float] = {}
    order = np.random.default_rng(0)
    for p in range(passes + 1):  # pass 0: every dataset's first pass (a first epoch)
        spent = dict.fromkeys(names, 0.0)
        for i in idx:
            for name in order.permutation(names).tolist():
                fn, planner, ds = rows[name]
                plan.set_planner(planner)
                if ds is not None:
                    ds.set_epoch(p)
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
    for name in later:
        if name.startswith("peer: "):
            ratio = first[name] / first["ds[i], default"]
            print(f"  default speed / {name[6:]}: {later[name] / default:.2f} (first pass {ratio:.2f})")
    full, floor = later["full decode alone"], later[FLOOR]
    print(f"  default speed / full decode alone: {full / default:.2f}; the strict floor allows at most "
          f"{full / floor:.2f} (full decode / decode at 1/8)")


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
