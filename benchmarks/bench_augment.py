"""Per-sample augmentation on one core: fastload.transforms against torchvision v2.

Each candidate augments the same 224×224 uint8 crops of real photographs (scikit-image's
bundled photos): fastload's transform on H×W×C numpy arrays with a per-sample numpy
generator, torchvision v2's transform of the same name and arguments on uint8 C×H×W
tensors (its fastest input: no PIL, no float conversion). Inputs and generators are made
before timing. Rounds are interleaved (fastload, torchvision, next candidate, ...) so a
busy machine slows both alike; the times are per image, the median over rounds, and the
ratio is the median over rounds of torchvision's time over fastload's in that round.
One core: torch.set_num_threads(1) and cv2.setNumThreads(1), so all the work runs on the
calling thread and its CPU time (time.thread_time) is what each image costs; on a shared
machine that excludes the time other processes held the core, which wall time
(also printed) does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from fastload import transforms as T  # noqa: E402
from fastload.photos.bundled import source_photos  # noqa: E402
from fastload.system import cpu_model  # noqa: E402

SIZE = 224
TARGETS = {"RandAugment(2, 9)": 3.0, "TrivialAugmentWide()": 3.0, "ColorJitter(0.4, 0.4, 0.4)": 3.0}


def torchvision_v2():
    """torchvision.transforms.v2, or None. torchvision's CUDA wheel installed --no-deps
    beside a CPU torch imports once the module registering its compiled ops is stubbed."""
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    try:
        import torchvision.transforms.v2 as v2
    except ImportError:
        return None
    return v2


def candidates(v2) -> list[tuple[str, object, object]]:
    """(name, fastload transform, torchvision transform or None)."""
    def peer(make):
        return make(v2) if v2 is not None else None
    return [
        ("RandAugment(2, 9)", T.RandAugment(2, 9), peer(lambda m: m.RandAugment(2, 9))),
        ("TrivialAugmentWide()", T.TrivialAugmentWide(), peer(lambda m: m.TrivialAugmentWide())),
        ("ColorJitter(0.4, 0.4, 0.4)", T.ColorJitter(0.4, 0.4, 0.4), peer(lambda m: m.ColorJitter(0.4, 0.4, 0.4))),
        ("AutoAugment(IMAGENET)", T.AutoAugment(), peer(lambda m: m.AutoAugment())),
        ("AugMix()", T.AugMix(), peer(lambda m: m.AugMix())),
    ]


def crops(per_photo: int, limit: int | None) -> list[np.ndarray]:
    """224×224 crops at deterministic positions of the photos (smaller ones upscaled first)."""
    rng = np.random.default_rng(0)
    out = []
    for img in list(source_photos().values())[:limit]:
        s = max(1.0, SIZE / min(img.shape[:2]))
        if s > 1:
            img = cv2.resize(img, (round(img.shape[1] * s), round(img.shape[0] * s)), interpolation=cv2.INTER_AREA)
        for _ in range(per_photo):
            y = int(rng.integers(0, img.shape[0] - SIZE + 1))
            x = int(rng.integers(0, img.shape[1] - SIZE + 1))
            out.append(np.ascontiguousarray(img[y:y + SIZE, x:x + SIZE]))
    return out


def time_fastload(t, images: list[np.ndarray], round_: int) -> tuple[float, float]:
    """(CPU, wall) seconds per image."""
    rngs = [np.random.default_rng((round_, i)) for i in range(len(images))]
    cpu, wall = time.thread_time(), time.perf_counter()
    for img, rng in zip(images, rngs):
        t(img, rng)
    return (time.thread_time() - cpu) / len(images), (time.perf_counter() - wall) / len(images)


def time_torchvision(t, tensors: list[torch.Tensor], round_: int) -> tuple[float, float]:
    """(CPU, wall) seconds per image."""
    torch.manual_seed(round_)
    cpu, wall = time.thread_time(), time.perf_counter()
    for x in tensors:
        t(x)
    return (time.thread_time() - cpu) / len(tensors), (time.perf_counter() - wall) / len(tensors)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few images, one round (seconds)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    p.add_argument("--json", default=None, help="append the result as one JSON line to this file")
    p.add_argument("--data", default=None, help="unused (the photos ship with scikit-image)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    v2 = torchvision_v2()
    images = crops(per_photo=1 if args.quick else 4, limit=4 if args.quick else None)
    tensors = [torch.from_numpy(img).permute(2, 0, 1).contiguous() for img in images]
    rounds = 1 if args.quick else args.rounds
    table = candidates(v2)
    for name, ours, theirs in table:  # warm-up: first-call imports and caches
        time_fastload(ours, images[:2], 10**6)
        if theirs is not None:
            time_torchvision(theirs, tensors[:2], 10**6)
    times: dict[str, dict[str, list[tuple[float, float]]]] = {name: {"fastload": [], "torchvision": []}
                                                              for name, _, _ in table}
    for r in range(rounds):
        for name, ours, theirs in table:
            times[name]["fastload"].append(time_fastload(ours, images, r))
            if theirs is not None:
                times[name]["torchvision"].append(time_torchvision(theirs, tensors, r))
    print(f"{len(images)} {SIZE}x{SIZE} uint8 crops of real photos, {rounds} interleaved rounds, one core "
          f"({cpu_model()}); per image: CPU time of the calling thread, median over rounds; ratio: median of "
          f"the rounds' torchvision/fastload ratios (CPU time, and wall time)")
    if v2 is None:
        print("torchvision is not installed: fastload only (make bench installs it)")
    print(f"{'transform':28s} {'fastload us':>12s} {'torchvision us':>15s} {'ratio':>7s} {'wall ratio':>11s}  target")
    rows = []
    for name, _, _ in table:
        ours, theirs = times[name]["fastload"], times[name]["torchvision"]
        ours_us = statistics.median(c for c, _ in ours) * 1e6
        theirs_us = statistics.median(c for c, _ in theirs) * 1e6 if theirs else None
        ratio = statistics.median(b[0] / a[0] for a, b in zip(ours, theirs)) if theirs else None
        wall_ratio = statistics.median(b[1] / a[1] for a, b in zip(ours, theirs)) if theirs else None
        target = TARGETS.get(name)
        verdict = "" if target is None or ratio is None else f">= {target:.0f}x {'met' if ratio >= target else 'MISSED'}"
        nan = float("nan")
        print(f"{name:28s} {ours_us:12.1f} {theirs_us or nan:15.1f} {ratio or nan:6.2f}x {wall_ratio or nan:10.2f}x  "
              f"{verdict}")
        rows.append({"transform": name, "fastload_us": ours_us, "torchvision_us": theirs_us, "ratio": ratio,
                     "wall_ratio": wall_ratio, "target": target,
                     "fastload_rounds_us": [[c * 1e6, w * 1e6] for c, w in ours],
                     "torchvision_rounds_us": [[c * 1e6, w * 1e6] for c, w in theirs]})
    if args.json:
        record = {"benchmark": "bench_augment", "quick": args.quick, "date": time.strftime("%Y-%m-%d"),
                  "images": len(images), "rounds": rounds, "cpu": cpu_model(), "torch": torch.__version__,
                  "rows": rows}
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
