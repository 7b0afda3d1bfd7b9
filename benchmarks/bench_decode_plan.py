"""Decode planner, one core: every plan of every sample measured, what the planner
predicted, and what each policy (the default, and each switch a user can flip) costs.

For the training preset (RandomResizedCrop 224 + flip, antialiased; epoch 0's crops)
and the eval preset (Resize 256 + CenterCrop 224), each sample of the photo set is run
through every plan the planner may choose for it (full decode, fast upsampling, each
DCT scale the crop allows, a region decode), end to end as the pipeline runs it (decode
into the thread's buffer, crop, antialiased resize into a batch slot: ``plan.execute``),
interleaved, fastest of ``--repeat``. Then:

* per plan: mean measured µs, and predicted / measured (median and 10th-90th percentile);
* per policy: the mean µs of the plans it picks for each sample: the default planner,
  ``FASTLOAD_ROI=trusted`` (region decodes, not strict), ``reduced_decode=False`` (full-decode pixels only),
  ``FASTLOAD_NO_CALIBRATION=1`` (built-in costs), full decode only, and the oracle (the
  fastest plan of each sample, which no planner can know beforehand); the default's
  ratio to each (>= 1: the default is faster).

Loader-level figures, where the hand-over and the other processes count too, are in
``bench_loader.py``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from common import parser, photo_folder, report

import fastload as fl
from fastload.datasets.base import sample_rng
from fastload.decode import costs, get_decoder, plan, read_header, roi
from fastload.decode.plan import MIN_RATIO, Planner, execute, plan_for_key


def eligible(header, crop, key: str) -> bool:
    """Whether the planner may choose ``key`` for ``crop`` (as Planner.choose decides)."""
    if key == "full":
        return True
    if key == "fast":
        return crop.antialias and not crop.window
    if key == "region":
        return not crop.window and header.components == 3 and not header.progressive
    f = int(key[0]) / 8
    ratio = min(crop.height / crop.out_h, crop.width / crop.out_w)
    return ratio * f >= MIN_RATIO and (crop.window or Planner._phase_ok(crop, f))


def measure(cases: list, keys: list[str], decoder, repeat: int) -> list[dict]:
    """Fastest µs of each eligible plan of each case, plans of a case back to back; CPU
    time of this thread, so that other jobs on a shared machine do not count."""
    slot = np.empty((224, 224, 3), np.uint8)
    best: list[dict] = [{k: np.inf for k in keys if eligible(hd, c, k)} for _, hd, c in cases]
    for r in range(repeat + 1):  # round 0 warms up
        for j, (data, hd, crop) in enumerate(cases):
            for key in best[j]:
                p = plan_for_key(key, hd, crop)
                start = time.thread_time()
                execute(p, data, decoder, hd, crop, slot)
                if r:
                    best[j][key] = min(best[j][key], (time.thread_time() - start) * 1e6)
    return best


def audit(name: str, cases: list, measured: list[dict], policies: dict) -> dict:
    keys = sorted({k for m in measured for k in m}, key=lambda k: (k != "full", k != "fast", k))
    default = policies["default"][0]
    print(f"{name}: {len(cases)} photos, one core, plans measured end to end (CPU µs, fastest of the rounds):")
    print(f"  {'plan':8s} {'samples':>7s} {'mean µs':>8s} {'predicted/measured: median':>27s} {'p10–p90':>11s}")
    per_plan = {}
    for key in keys:
        rows = [(m[key], default.predict(hd, c, key)) for m, (_, hd, c) in zip(measured, cases) if key in m]
        ratio = np.array([p / t for t, p in rows])
        per_plan[key] = {"samples": len(rows), "mean_us": float(np.mean([t for t, _ in rows])),
                         "predicted_over_measured": float(np.median(ratio))}
        print(f"  {key:8s} {len(rows):7d} {per_plan[key]['mean_us']:8.0f} {np.median(ratio):27.2f} "
              f"{np.percentile(ratio, 10):5.2f}–{np.percentile(ratio, 90):.2f}")
    totals, shares = {}, {}
    for label, (planner, scales) in policies.items():
        chosen = [planner.choose(hd, c, scales).key for _, hd, c in cases]
        totals[label] = float(np.mean([m[k] for m, k in zip(measured, chosen)]))
        shares[label] = {k: chosen.count(k) / len(chosen) for k in sorted(set(chosen))}
    totals["oracle (fastest plan per sample)"] = float(np.mean([min(m.values()) for m in measured]))
    print(f"  {'policy':34s} {'mean µs':>8s} {'default is':>11s}  plans chosen")
    for label, us in totals.items():
        plans = ", ".join(f"{k} {v:.0%}" for k, v in shares.get(label, {}).items())
        print(f"  {label:34s} {us:8.0f} {us / totals['default']:10.3f}x  {plans}")
    return {"per_plan": per_plan, "policy_mean_us": totals, "policy_plans": shares,
            "default_vs": {k: v / totals["default"] for k, v in totals.items()}}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--limit", type=int, default=600, help="samples of the photo set measured")
    args = p.parse_args()
    torch.set_num_threads(1)
    root = photo_folder(args)
    repeat = 1 if args.quick else args.repeat
    fitted = plan.get_planner().costs  # the cached calibration (or the built-in costs)
    region = roi.available()
    policies = {  # the default is strict: region decodes only for trusted files
        "default": (Planner(fitted, False), True),
        "FASTLOAD_ROI=trusted": (Planner(fitted, region), True),
        "reduced_decode=False": (Planner(fitted, False), False),
        "FASTLOAD_NO_CALIBRATION=1": (Planner(costs.DEFAULT_COSTS, False), True),
        "full decode only": (Planner(fitted, False), False),
    }
    decoder = get_decoder()
    ds = fl.ImageFolder(root)
    n = min(len(ds), 32 if args.quick else args.limit)
    # Evenly spread over the set (its classes are in order of index).
    picks = np.linspace(0, len(ds) - 1, n).round().astype(int)
    blobs = [ds.read(int(i))[0] for i in picks]
    headers = [read_header(b) for b in blobs]
    keys = ["full", "fast", *costs.SCALE_KEYS] + (["region"] if region else [])
    results = {}
    for name, tf in (("train", fl.transforms.train(224)), ("eval", fl.transforms.eval(224))):
        cases = [(b, hd, tf.plan(hd.height, hd.width, sample_rng(0, 0, int(i))))
                 for b, hd, i in zip(blobs, headers, picks) if hd.format == "jpeg" and hd.components != 4]
        results[name] = audit(name, cases, measure(cases, keys, decoder, repeat), policies)
    print(f"(decoder {decoder.name}, region decode {'nvImageCodec ' + str(roi.version()) if region else 'off'}, "
          f"calibration: {'built-in costs' if fitted is costs.DEFAULT_COSTS else 'cached for this machine'}, "
          f"margin {plan.MARGIN:.0%})")
    report("bench_decode_plan", args, {"images": n, "results": results, "decoder": decoder.name,
                                       "region_decode": roi.version() if region else None,
                                       "calibrated": fitted is not costs.DEFAULT_COSTS, "costs": fitted})


if __name__ == "__main__":
    main()
