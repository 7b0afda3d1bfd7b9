"""The one-screen summary of a gpu-check call, from its records (one JSON line each).

    python benchmarks/gpu_summary.py gpu-results/gpu-check.jsonl

The records: the call's plan ({"plan": ...}, first), one per step as it ends ({"step",
"state", "rc", "seconds", "limit", "last", "gpu_before", "gpu_after"}) and the steps'
measurements ({"benchmark", ...}). The summary names every step with its state (ok, FAIL,
TIME: stopped at its limit, SKIP: not run), the headline figures (images/s min / median /
max over the repeats), and each target met or missed with its figure: issue 31's
byte-identical batches, and issue 38's, every ratio judged in every repeat (its smallest
per-repeat value), with the range shown. gpu_check.py rewrites it after every step (no torch
needed here).
"""

from __future__ import annotations

import json
import statistics
import sys

GPU_DECODE_MIN = 1.5  # decode="gpu" / decode="cpu" (14 workers)
BOTH_DECODE_MIN = 2.0  # decode="gpu" with the CPU's share / decode="cpu"
R18_VS_ALONE_MIN = 0.95  # fastload's best mode / the model alone
R18_VS_PEER_MIN = 1.5  # fastload's best mode / the better peer
DATA_WAIT_MAX = 0.05  # of the ResNet-50 step, 4 workers
R50_WORKERS = 4
H2D_SHARE_MIN = 0.85  # of the plain copy timed the same way, 14 workers
H2D_WORKERS = 14
PIXEL_LEVELS_MAX = 1.0  # mean |gpu - cpu| over the batch
MIN_REPEATS, MIN_STEPS = 3, 100  # honest timing
PEERS = ("DataLoader best", "timm create_loader")
ALONE = "model alone"
PIXELS = "decode='gpu' pixels within 1 level mean of the CPU path"  # gpu_correct.PIXELS
TORCHVISION = "torchvision decode_jpeg cuda"  # bench_gpu_decode.TORCHVISION


def load(jsonl: str) -> list[dict]:
    """The records; a line cut short (the call stopped while writing it) is left out."""
    records = []
    with open(jsonl) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def latest(records: list[dict], name: str, key: str | None = None) -> dict | None:
    """The last record of benchmark ``name`` (holding ``key``, if given)."""
    found = [r for r in records if r.get("benchmark") == name and (key is None or key in r)]
    return found[-1] if found else None


def trained(records: list[dict]) -> dict:
    """model -> feed -> {"images_per_s" (median), "min", "max", "wait_share", "step_ms" (medians),
    "runs"}: from the model's record, else (the step stopped within the model) from the runs
    it recorded, marked "partial"."""
    runs: dict = {}
    whole: set = set()
    for r in records:
        if r.get("benchmark") == "bench_gpu_train":
            for model, feeds in r.get("results", {}).items():
                runs[model] = {label: list(f.get("runs", [])) for label, f in feeds.items()}
                whole.add(model)
        elif r.get("benchmark") == "bench_gpu_train_run" and r["model"] not in whole:
            runs.setdefault(r["model"], {}).setdefault(r["loader"], []).append(r)
    out: dict = {}
    for model, feeds in runs.items():
        out[model] = {}
        for label, rs in feeds.items():
            if not rs:
                continue
            rates = [x["images_per_s"] for x in rs]
            out[model][label] = {"images_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                                 "wait_share": statistics.median(x["wait_share"] for x in rs),
                                 "step_ms": statistics.median(x["step_ms"] for x in rs), "runs": rs,
                                 "workers": rs[0].get("workers"), "steps": rs[0].get("steps")}
            if model not in whole:
                out[model][label]["partial"] = len(rs)
    return out


def by_repeat(runs: list) -> dict[int, float]:
    """repeat -> images/s (records before the repeats: runs in order, or bare figures)."""
    return {i: x for i, x in enumerate(runs)} if runs and not isinstance(runs[0], dict) else \
        {x.get("repeat", i): x["images_per_s"] for i, x in enumerate(runs)}


def per_repeat(num: dict[int, float], den: dict[int, float]) -> list[float]:
    return [num[r] / den[r] for r in sorted(num) if r in den and den[r]]


def ratio_figure(values: list[float], pct: bool = False) -> str:
    """"1.62x (per repeat 1.55-1.70x, 3 repeats)" of per-repeat ratios."""
    fmt = (lambda v: f"{v:.0%}") if pct else (lambda v: f"{v:.2f}x")
    if not values:
        return "not measured"
    return (f"median {fmt(statistics.median(values))} (per repeat {fmt(min(values))} to {fmt(max(values))}, "
            f"{len(values)} repeat{'s' if len(values) != 1 else ''})")


def best_mode(feeds: dict) -> str | None:
    modes = [label for label in feeds if label.startswith("fastload")]
    return max(modes, key=lambda label: feeds[label]["images_per_s"]) if modes else None


def r18_ratios(r18: dict) -> tuple[str | None, list[float], list[float]]:
    """(fastload's best mode, its per-repeat ratios to the better peer, to the model alone)."""
    best = best_mode(r18)
    if best is None:
        return None, [], []
    mine = by_repeat(r18[best]["runs"])
    peers = [by_repeat(r18[p]["runs"]) for p in PEERS if p in r18]
    better = {rep: max(p[rep] for p in peers if rep in p) for rep in mine if any(rep in p for p in peers)}
    alone = by_repeat(r18[ALONE]["runs"]) if ALONE in r18 else {}
    return best, per_repeat(mine, better), per_repeat(mine, alone)


def decode_ratios(d: dict, num: str, den: str = "cpu") -> list[float]:
    modes = d.get("decode", {})
    if num not in modes or den not in modes or "runs" not in modes[num]:
        return []
    return per_repeat(by_repeat(modes[num]["runs"]), by_repeat(modes[den]["runs"]))


def targets(records: list[dict]) -> list[tuple[str, str, str]]:
    """(state, target, figure) of each target; state "met", "MISSED" or "-" (not measured).
    A ratio is met when its smallest per-repeat value meets it."""
    out = []

    def add(ok: bool | None, name: str, figure: str) -> None:
        state = "-" if ok is None else "met" if ok else "MISSED"
        out.append((state, name, figure if ok is not None else figure or "not measured"))

    def add_ratio(values: list[float], least: float, name: str, extra: str = "", pct: bool = False,
                  absent: str = "") -> None:
        add(min(values) >= least if values else None, name, f"{ratio_figure(values, pct)}{extra}" if values
            else absent)

    c = latest(records, "correctness")
    equal = {k: v for k, v in c["checks"].items() if k.startswith("uint8")} if c else {}
    add(all(v["ok"] for v in equal.values()) if equal else None, "uint8 batches byte-identical to the CPU's",
        "; ".join(f"{k}: {'equal' if v['ok'] else v['detail']}" for k, v in equal.items()))
    px = c["checks"].get(PIXELS) if c else None
    add(px["ok"] if px else None, f'decode="gpu" pixels within {PIXEL_LEVELS_MAX:g} level mean of the CPU path',
        px["detail"] if px else "")

    d = latest(records, "bench_gpu_decode")
    add_ratio(decode_ratios(d, "gpu") if d else [], GPU_DECODE_MIN,
              f'decode="gpu" >= {GPU_DECODE_MIN:g}x the CPU default ({d["workers"] if d else 14} workers)')
    both = decode_ratios(d, "gpu+cpu") if d else []
    no_share = "not measured (no gpu+cpu mode: left out of --modes, or the Loader takes no share option)"
    add_ratio(both, BOTH_DECODE_MIN, f'both decoders (decode="gpu" + the CPU\'s share) >= {BOTH_DECODE_MIN:g}x the '
              f"CPU default", absent=no_share if d and not both else "")

    r18 = trained(records).get("resnet18", {})
    best, vs_peer, vs_alone = r18_ratios(r18)
    tag = f" ({best})" if best else ""
    add_ratio(vs_alone, R18_VS_ALONE_MIN, f"ResNet-18 fastload's best mode >= {R18_VS_ALONE_MIN:.0%} of the model "
              f"alone", tag, pct=True)
    add_ratio(vs_peer, R18_VS_PEER_MIN, f"ResNet-18 fastload's best mode >= {R18_VS_PEER_MIN:g}x the better peer, "
              f"every repeat", tag)

    r50 = trained(records).get("resnet50", {})
    modes = {k: v for k, v in r50.items() if k.startswith("fastload")}
    if modes:
        label = min(modes, key=lambda k: modes[k]["wait_share"])
        worst = max(x["wait_share"] for x in modes[label]["runs"])
        workers = modes[label].get("workers")
        figure = f"{worst:.1%} ({label}, {workers} workers, worst of {len(modes[label]['runs'])} run(s))"
        add(worst < DATA_WAIT_MAX if workers == R50_WORKERS else None,
            f"ResNet-50 data wait < {DATA_WAIT_MAX:.0%} with {R50_WORKERS} workers",
            figure if workers == R50_WORKERS else f"not measured with {R50_WORKERS} workers: {figure}")
    else:
        add(None, f"ResNet-50 data wait < {DATA_WAIT_MAX:.0%} with {R50_WORKERS} workers", "")

    h = latest(records, "bench_h2d")
    at = next((w for w in (h or {}).get("by_workers", []) if w["workers"] == H2D_WORKERS), None)
    add_ratio(at["share_per_repeat"] if at else [], H2D_SHARE_MIN,
              f"H2D stage >= {H2D_SHARE_MIN:.0%} of the plain copy timed the same way, {H2D_WORKERS} workers",
              pct=True)

    honest = []
    if r18:
        honest.append(("ResNet-18", len({x.get("repeat") for f in r18.values() for x in f["runs"]}),
                       min(f.get("steps") or 0 for f in r18.values())))
    if d and d.get("decode"):
        honest.append(("decode", d.get("repeats", 0), d.get("timed_batches", 0)))
    add(all(n >= MIN_REPEATS and k >= MIN_STEPS for _, n, k in honest) if honest else None,
        f"timing: >= {MIN_REPEATS} repeats of >= {MIN_STEPS} timed steps",
        "; ".join(f"{name} {n} x {k}" for name, n, k in honest))
    return out


def figures(records: list[dict]) -> list[str]:
    lines = []
    c = latest(records, "correctness")
    if c:
        lines.append("correctness: " + "; ".join(f"{'ok' if v['ok'] else 'FAIL'} {k}" for k, v in c["checks"].items()))
    for model, loaders in trained(records).items():
        partial = " (PARTIAL: the step stopped within this model)" if any(
            "partial" in r for r in loaders.values()) else ""
        lines.append(f"{model}: images/s min / median / max, data wait, step ms{partial}")
        lines += [f"  {name:20s} {r['min']:6.0f} {r['images_per_s']:6.0f} {r['max']:6.0f} {r['wait_share']:7.1%} "
                  f"{r['step_ms']:6.1f}  {len(r['runs'])} run(s), {r.get('workers')} workers"
                  for name, r in loaders.items()]
    t = latest(records, "bench_gpu_train")
    if t and t.get("dataloader"):
        lines.append(f"DataLoader best: {t['dataloader']['workers']} workers, prefetch_factor "
                     f"{t['dataloader']['prefetch_factor']} (swept); timm {t.get('versions', {}).get('timm', '?')}")
    d = latest(records, "bench_gpu_decode")
    if d:
        lines.append(f"decode (batch {d['batch_size']}, {d['workers']} workers), images/s min / median / max, "
                     f"CPU ms per image:")
        for name, m in d["decode"].items():
            lo, hi = m.get("images_per_s_min", m["images_per_s"]), m.get("images_per_s_max", m["images_per_s"])
            cpu = f"{1e3 * m['cpu_s_per_image']:.2f}" if m.get("cpu_s_per_image") else "-"
            lines.append(f"  {name:28s} {lo:6.0f} {m['images_per_s']:6.0f} {hi:6.0f}  {cpu}")
    rc = latest(records, "bench_gpu_decode", "recipe")
    if rc:
        f, t2 = rc["recipe"]["fastload"]["images_per_s"], rc["recipe"]["timm"]["images_per_s"]
        lines.append(f"timm recipe: fastload {f:.0f}/s, timm prefetcher + FastCollateMixup {t2:.0f}/s (medians)")
    h = latest(records, "bench_h2d")
    if h:
        for w in h.get("by_workers", []):
            stage = f"{w['stage_gbps']:.1f} GB/s" if w.get("stage_gbps") else "- (no copy events)"
            lines.append(f"H2D ({h['batch_mb']:.1f} MB batches, {w['workers']} workers): device stage {stage}, plain "
                         f"copy {w['plain_gbps']:.1f} GB/s (medians, A B B A)")
    return lines


def clocks(steps: list[dict]) -> list[str]:
    """One line: the GPU's clocks before the first step and after the last, and the steps after
    which a throttle reason was active."""
    read = [(s["step"], s.get(k, {}).get("values")) for s in steps for k in ("gpu_before", "gpu_after")]
    read = [(step, v) for step, v in read if v]
    if not read:
        return []
    throttled = sorted({step for step, v in read if v.split(",")[-1].strip() not in ("0x0000000000000000", "0x0")})
    return [f"GPU sm, mem, C, throttle: before {read[0][0]} {read[0][1]}; after {read[-1][0]} {read[-1][1]}; "
            f"throttle reasons active at: {', '.join(throttled) or 'none'}"]


def render(records: list[dict]) -> list[str]:
    plan = next((r["plan"] for r in records if "plan" in r), {})
    steps = [r for r in records if "step" in r]
    setup = latest(records, "setup") or {}
    ok = sum(s["state"] == "ok" for s in steps)
    spent = sum(s["seconds"] for s in steps)
    dry = " DRY RUN (no GPU: the figures below are not GPU figures)" if plan.get("dry_run") else ""
    slack = plan.get("slack", 1)
    scaled = f"; limits and budget times {slack:g} here" if slack != 1 else ""
    lines = [
        f"gpu-check {plan.get('date', '?')} on {setup.get('device', '?')}{dry}",
        f"{ok} of {len(plan.get('steps', steps))} steps ok; {spent:.0f} s of the {plan.get('budget', 0):.0f} s budget "
        f"(step limits sum to {plan.get('limits', 0)} s{scaled})",
    ]
    for s in steps:
        lines.append(f"  {s['state']:4s} {s['step']:12s} {s['seconds']:5.0f} s of {s['limit']:3d}  {s['last'][:90]}")
    lines += clocks(steps)
    lines += figures(records)
    lines.append("targets:")
    lines += [f"  {state:6s} {name}: {figure}" for state, name, figure in targets(records)]
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    print("\n".join(render(load(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
