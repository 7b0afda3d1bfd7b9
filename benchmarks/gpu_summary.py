"""The one-screen summary of a gpu-check call, from its records (one JSON line each).

    python benchmarks/gpu_summary.py gpu-results/gpu-check.jsonl

The records: the call's plan ({"plan": ...}, first), one per step as it ends ({"step",
"state", "rc", "seconds", "limit", "last"}) and the steps' measurements ({"benchmark",
...}). The summary names every step with its state (ok, FAIL, TIME: stopped at its limit,
SKIP: not run), the headline figures, and each target of issue 31 met or missed with its
figure. gpu_check.py rewrites it after every step (no torch needed here).
"""

from __future__ import annotations

import json
import sys

DATA_WAIT_MAX = 0.05  # of the ResNet-50 step
R18_VS_PEER_MIN = 1.5
GPU_DECODE_MIN = 2.0
H2D_SHARE_MIN = 0.85
PEERS = ("DataLoader best", "timm create_loader")


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
    """model -> loader -> its figures: a model's record, else (the step stopped within the
    model) the mean of the runs it recorded, marked "partial"."""
    models: dict = {}
    runs: dict = {}
    for r in records:
        if r.get("benchmark") == "bench_gpu_train":
            models.update(r.get("results", {}))
        elif r.get("benchmark") == "bench_gpu_train_run":
            runs.setdefault(r["model"], {}).setdefault(r["loader"], []).append(r)
    for model, loaders in runs.items():
        if model not in models:
            models[model] = {name: {**{k: sum(x[k] for x in rs) / len(rs) for k in ("images_per_s", "wait_share",
                                                                                    "step_ms")},
                                    "partial": len(rs)} for name, rs in loaders.items()}
    return models


def targets(records: list[dict]) -> list[tuple[str, str, str]]:
    """(state, target, figure) of each target; state "met", "MISSED" or "-" (not measured)."""
    out = []

    def add(ok: bool | None, name: str, figure: str) -> None:
        state = "-" if ok is None else "met" if ok else "MISSED"
        out.append((state, name, figure if ok is not None else "not measured"))

    c = latest(records, "correctness")
    equal = {k: v for k, v in c["checks"].items() if k.startswith("uint8")} if c else {}
    add(all(v["ok"] for v in equal.values()) if equal else None, "uint8 batches byte-identical to the CPU's",
        "; ".join(f"{k}: {'equal' if v['ok'] else v['detail']}" for k, v in equal.items()))
    models = trained(records)
    r50 = models.get("resnet50", {}).get("fastload")
    add(r50["wait_share"] < DATA_WAIT_MAX if r50 else None, f"data wait < {DATA_WAIT_MAX:.0%} of the ResNet-50 step",
        f"{r50['wait_share']:.1%}" if r50 else "")
    r18 = models.get("resnet18", {})
    peers = {k: r18[k]["images_per_s"] for k in PEERS if k in r18}
    if "fastload" in r18 and peers:
        best = max(peers, key=peers.__getitem__)
        ratio = r18["fastload"]["images_per_s"] / peers[best]
        add(ratio >= R18_VS_PEER_MIN, f"ResNet-18 images/s >= {R18_VS_PEER_MIN}x the better peer",
            f"{ratio:.2f}x ({r18['fastload']['images_per_s']:.0f} against {best} {peers[best]:.0f})")
    else:
        add(None, f"ResNet-18 images/s >= {R18_VS_PEER_MIN}x the better peer", "")
    d = latest(records, "bench_gpu_decode")
    add(d["gpu_vs_cpu"] >= GPU_DECODE_MIN if d else None, f'decode="gpu" >= {GPU_DECODE_MIN:g}x the CPU default',
        f"{d['gpu_vs_cpu']:.2f}x" if d else "")
    h = latest(records, "bench_h2d")
    share = h.get("stage_share") if h else None
    add(share >= H2D_SHARE_MIN if share is not None else None, f"H2D >= {H2D_SHARE_MIN:.0%} of a pinned copy_",
        f"{share:.0%}" if share is not None else "")
    return out


def figures(records: list[dict]) -> list[str]:
    lines = []
    c = latest(records, "correctness")
    if c:
        lines.append("correctness: " + "; ".join(f"{'ok' if v['ok'] else 'FAIL'} {k}" for k, v in c["checks"].items()))
    for model, loaders in trained(records).items():
        partial = " (PARTIAL: the step stopped within this model; runs per feed below)" if any(
            "partial" in r for r in loaders.values()) else ""
        lines.append(f"{model}: images/s, data wait share of the step, step ms{partial}")
        lines += [f"  {name:20s} {r['images_per_s']:8.0f} {r['wait_share']:7.1%} {r['step_ms']:8.1f}"
                  + (f"  {r['partial']} run(s)" if "partial" in r else "") for name, r in loaders.items()]
    d = latest(records, "bench_gpu_decode")
    if d:
        cpu, gpu = d["decode"]["cpu"]["images_per_s"], d["decode"]["gpu"]["images_per_s"]
        lines.append(f"decode (batch {d['batch_size']}, {d['workers']} workers): cpu {cpu:.0f}/s, gpu {gpu:.0f}/s, "
                     f"{d['gpu_vs_cpu']:.2f}x")
    rc = latest(records, "bench_gpu_decode", "recipe")
    if rc:
        f, t = rc["recipe"]["fastload"]["images_per_s"], rc["recipe"]["timm"]["images_per_s"]
        lines.append(f"timm recipe: fastload {f:.0f}/s, timm prefetcher + FastCollateMixup {t:.0f}/s, "
                     f"{rc['fastload_vs_timm']:.2f}x")
    h = latest(records, "bench_h2d")
    if h:
        stage = f"{h['stage_gbps']:.1f} GB/s" if h.get("stage_gbps") else "- (no copy events)"
        lines.append(f"H2D ({h['batch_mb']:.1f} MB batches): device stage {stage}, plain copy_ "
                     f"{h['plain_gbps']:.1f} GB/s")
    return lines


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
