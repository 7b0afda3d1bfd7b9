"""Decode rate per core of each backend, full and reduced-size, on the sample dataset.

The fastest full-decode rate times the cores in use is the machine's "decode limit".
Also times the whole per-sample pipeline (read + reduced decode + transform) in one process.
"""

from __future__ import annotations

import glob
import os

from common import parser, report, sample_folder, timed

import fastload as fl
from fastload.decode import BACKENDS, get_decoder
from fastload.system import available_cpus


def main() -> None:
    args = parser(__doc__).parse_args()
    root = sample_folder(args)
    files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    blobs = [open(f, "rb").read() for f in files]
    rows = {}
    for name in BACKENDS:
        try:
            dec = get_decoder(name)
        except ImportError as e:
            print(f"{name:10s} unavailable: {e}")
            continue
        for label, scale in (("full", 1.0), ("reduced 1/2", 0.5), ("reduced 1/4", 0.25)):
            seconds = timed(lambda: [dec.decode(b, scale) for b in blobs], repeat=1 if args.quick else 3)
            rows[f"{name} {label}"] = len(blobs) / seconds
    # The whole per-sample pipeline in one process: read + decode (reduced) + transform.
    for name, tf in (("train", fl.transforms.train(224)), ("eval", fl.transforms.eval(224))):
        ds = fl.ImageFolder(root, tf)
        seconds = timed(lambda: [ds.load(i, 0, 0) for i in range(len(ds))], repeat=1 if args.quick else 3)
        rows[f"ImageFolder.load {name} 224"] = len(ds) / seconds
    best_full = max(v for k, v in rows.items() if k.endswith("full"))
    cores = available_cpus()
    print(f"decode, {len(blobs)} sample JPEGs, one thread (images/s per core):")
    for key, rate in rows.items():
        print(f"  {key:28s} {rate:8.0f}   ({rate / best_full:.2f}x the fastest full decode)")
    print(f"decode limit: {best_full:.0f} images/s/core x {cores} cores = {best_full * cores:.0f} images/s")
    report("bench_decode", args, {"images_per_s_per_core": rows, "decode_limit": best_full * cores, "cores": cores})


if __name__ == "__main__":
    main()
