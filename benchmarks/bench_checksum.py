"""What the check of verified bytes costs against the decode it allows (issue 39's target: <= 5%).

A sample whose bytes were verified strictly once (``fastload verify``, a converter's
``--verify``) is checked by its CRC32C (:func:`fastload.verified.crc32c`) and then decoded the
cheapest way its crop allows: a region or DCT-scaled decode that cannot see damage
(``plan_decode(..., verified=True)``). This times, per photo, one core, in alternating order:

* ``crc32c``: the checksum of the file's bytes;
* ``verified decode``: ``fl.transforms.train(224)``'s decode of those bytes as verified
  (plan, decode, resize, flip): what the checksum allows;
* ``strict decode``: the same transform's decode of unverified bytes (what runs without it).

It reports, for 2-8 MP photos (:func:`common.large_photos`) and the ImageNet-sized photo set
(:func:`common.photo_folder`), the medians per photo and the ratio of the summed checksum time
to the summed decode times, and which decoders ran.

Usage: ``python benchmarks/bench_checksum.py [--large 48] [--images 400] [--repeat 3]``;
``--quick`` runs a few photos once.
"""

from __future__ import annotations

import glob
import os
import statistics

import numpy as np
from common import ROOT, large_photos, parser, photo_folder, report, timed

import fastload as fl
from fastload.decode import get_decoder, roi
from fastload.verified import crc32c


def measure(paths: list[str], repeat: int) -> dict:
    transform, decoder = fl.transforms.train(224), get_decoder()
    times: dict[str, list[float]] = {"crc32c": [], "verified decode": [], "strict decode": []}
    kinds: dict[str, int] = {}
    for k, path in enumerate(paths):
        data = np.fromfile(path, np.uint8)

        def decode(verified: bool, k: int = k, data: np.ndarray = data) -> None:
            rng = fl.datasets.sample_rng(0, 0, k)  # the same crop for both decodes of a photo
            steps = transform.plan_decode(data, decoder, rng, verified=verified)
            transform.finish_decode(data, decoder, steps, rng)

        runs = [
            ("crc32c", lambda data=data: crc32c(data)),
            ("verified decode", lambda: decode(True)),
            ("strict decode", lambda: decode(False)),
        ]
        if k == 0:  # warm-up: the decoders' first calls load libraries and make handles
            for _, fn in runs:
                fn()
        steps = transform.plan_decode(data, decoder, fl.datasets.sample_rng(0, 0, k), verified=True)
        kind = steps.plan.kind if steps.plan is not None else "decoder's own"
        kinds[kind] = kinds.get(kind, 0) + 1
        for name, fn in runs if k % 2 == 0 else runs[::-1]:  # alternate: drift hits all alike
            times[name].append(timed(fn, repeat))
    total = {name: sum(t) for name, t in times.items()}
    return {
        "photos": len(paths),
        "mean_megapixels": round(statistics.mean(_megapixels(p) for p in paths), 2),
        "median_ms": {name: round(1e3 * statistics.median(t), 3) for name, t in times.items()},
        "crc_over_verified_decode": round(total["crc32c"] / total["verified decode"], 4),
        "crc_over_strict_decode": round(total["crc32c"] / total["strict decode"], 4),
        "verified plans": kinds,
    }


def _megapixels(path: str) -> float:
    from fastload.decode import read_header

    with open(path, "rb") as f:
        header = read_header(f.read())
    return header.height * header.width / 1e6


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--large", type=int, default=48, help="2-8 MP photos")
    p.add_argument("--repeat", type=int, default=3, help="best of this many timings per photo and path")
    args = p.parse_args()
    if args.quick:
        args.large, args.images, args.repeat = 4, 48, 1
    large_root = large_photos(os.path.join(args.data, f"large{args.large}"), args.large)
    sets = {
        "2-8 MP photos": sorted(glob.glob(os.path.join(large_root, "c0", "*.jpg")))[: args.large],
        "ImageNet-sized photos": sorted(glob.glob(os.path.join(photo_folder(args, quiet=True), "*", "*.jpg"))),
    }
    result: dict = {"decoder": get_decoder().name, "region decoder": roi.describe() or "none"}
    for name, paths in sets.items():
        result[name] = measure(paths, args.repeat)
        r = result[name]
        print(
            f"{name}: {r['photos']} photos, {r['mean_megapixels']} MP mean; median ms per photo {r['median_ms']}; "
            f"checksum / verified decode {r['crc_over_verified_decode']:.2%}, "
            f"/ strict decode {r['crc_over_strict_decode']:.2%}; verified plans {r['verified plans']}"
        )
    print(f"decoder {result['decoder']}; region decoder {result['region decoder']}; root {ROOT}")
    report("bench_checksum", args, result)


if __name__ == "__main__":
    main()
