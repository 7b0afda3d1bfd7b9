"""How close to the full-decode limit the default training pipeline can get at all (issue 39).

Issue 39 asks fastload's default to reach 75% of the full-decode limit on ImageNet-sized
photos (the limit: the cores times one core's full decode of each photo, the issue's
reference). Every sample of the default pipeline is at least decoded as planned and
cropped and resized (antialiased, pixel for pixel torchvision v2's) into its batch row;
reading, header parsing, planning, the flip, collation and the hand-over come on top. So
the full decode's CPU time over that least work bounds the share any loader doing the
same work can reach, whatever its runner.

Per round, over the same photos in memory and on one core (CPU time of this thread):

- ``full``: the limit's full decode (``bench_loader.full_decoder``), a new array each;
- ``planned``: the decode the default plans for the sample's RandomResizedCrop 224 crop
  (``fastload.decode.plan``; strict: full, fast upsampling or a DCT scale);
- ``resize``: that crop resized into a 224 x 224 row (``Crop.apply``, antialiased);
- ``least``: planned + resize, one after the other per sample.

Each sample runs the four one after another (their order turned by one per sample), each
timed on its own, so a machine's drift (this VM's neighbours) falls on all four alike; each
round draws its crops anew (its epoch). Printed: µs per sample, medians over rounds with
the range, and the ceiling ``full / least`` per round.

    python benchmarks/bench_ceiling.py --data /tmp/bench-data            # 2,000 photos, ~1 min
"""

from __future__ import annotations

import math
import time

import numpy as np
from bench_loader import full_decoder
from common import median, parser, photo_folder, photo_set_record, report

import fastload as fl
from fastload.datasets.base import sample_rng
from fastload.decode import default_backend, get_decoder, plan, read_header
from fastload.decode.libjpeg import scaled_size, scratch


def interleaved_us(steps: dict, items: list) -> dict[str, float]:
    """CPU µs per sample of each step, the steps run in turn on each sample (order rotated)."""
    names = list(steps)
    spent = dict.fromkeys(names, 0.0)
    for k, item in enumerate(items):
        for j in range(len(names)):
            name = names[(j + k) % len(names)]
            start = time.thread_time()
            steps[name](item)
            spent[name] += time.thread_time() - start
    return {name: s / len(items) * 1e6 for name, s in spent.items()}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    root = photo_folder(args)
    tf = fl.transforms.train(224)
    ds = fl.ImageFolder(root, transform=tf)
    crop_t = tf.transforms[0]
    name = ds.decoder or default_backend()
    dec, planner = get_decoder(name), plan.get_planner()
    full, full_name = full_decoder()
    idx = list(range(len(ds) if not args.quick else 48))
    data = [ds.read(i)[0] for i in idx]
    headers = [read_header(b) for b in data]
    slot = np.empty((224, 224, 3), np.uint8)
    rounds: dict[str, list[float]] = {"full": [], "planned": [], "resize": [], "least": []}
    kinds: dict[str, int] = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        crops = [crop_t.plan(hd.height, hd.width, sample_rng(0, r, i)) for i, hd in zip(idx, headers)]
        plans = [planner.choose(hd, c) for hd, c in zip(headers, crops)]

        def planned(i, crops=crops, plans=plans):
            hd, pl = headers[i], plans[i]
            buf = None if pl.region else scratch(math.prod(scaled_size(hd, pl.scale)) * 3)
            return pl.decode(data[i], dec, hd, out=buf)

        decoded = [np.array(planned(i)) for i in idx]

        def resize(i, crops=crops, plans=plans, decoded=decoded):
            return crops[i].apply(decoded[i], headers[i].height, headers[i].width, slot, float(plans[i].scale),
                                  plans[i].origin)

        def least(i, resize=resize, planned=planned, crops=crops, plans=plans):
            img = planned(i)
            return crops[i].apply(img, headers[i].height, headers[i].width, slot, float(plans[i].scale),
                                  plans[i].origin)

        steps = {"full": lambda i: full(data[i]), "planned": planned, "resize": resize, "least": least}
        got = interleaved_us(steps, idx)
        if r:
            for step, us in got.items():
                rounds[step].append(us)
            for pl in plans:
                kinds[pl.kind] = kinds.get(pl.kind, 0) + 1
    print(f"{len(idx)} photos, {args.rounds} rounds, CPU µs per sample on one core (median, range); "
          f"full decode: {full_name}, planned: {name}")
    for step, values in rounds.items():
        print(f"  {step:8s} {median(values):8.1f}  ({min(values):.1f}-{max(values):.1f})")
    ceilings = [f / s for f, s in zip(rounds["full"], rounds["least"])]
    print(f"plans: {', '.join(f'{k} {v / sum(kinds.values()):.1%}' for k, v in sorted(kinds.items()))}")
    print(f"ceiling (full / least) per round: {', '.join(f'{c:.3f}' for c in ceilings)}; median {median(ceilings):.3f}")
    report("bench_ceiling", args, {"set": photo_set_record(root), "full_decoder": full_name, "decoder": name,
                             "us": rounds, "plans": kinds, "ceilings": ceilings})


if __name__ == "__main__":
    main()
