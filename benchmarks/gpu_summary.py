"""The records of a gpu_suite.sh call (one JSON line each) and its one-screen summary.

    gpu_summary.py --record CALL.jsonl STEP RC SECONDS OUTPUT   # a step's record
    gpu_summary.py --append CALL.jsonl NAME FILE.json           # a JSON report as one record
    gpu_summary.py CALL.jsonl                                   # the summary
"""

from __future__ import annotations

import json
import sys


def last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def append(jsonl: str, record: dict) -> None:
    with open(jsonl, "a") as f:
        f.write(json.dumps(record) + "\n")


def gpu_train(r: dict) -> list[str]:
    out = []
    for model, loaders in r.get("results", {}).items():
        cells = [f"{name} {m['images_per_s']:.0f}/s (wait {m['wait_share']:.1%})" for name, m in loaders.items()]
        out.append(f"{model}: " + "; ".join(cells))
    return out


def h2d(r: dict) -> list[str]:
    steps = ", ".join(f"{k} {v:.2f}" for k, v in r.get("step_ms", {}).items())
    share = r["prefetcher_gbps"] / r["plain_gbps"] if r.get("plain_gbps") else float("nan")
    return [f"H2D plain copy_ {r.get('plain_gbps', 0):.1f} GB/s, prefetcher {r.get('prefetcher_gbps', 0):.1f} GB/s "
            f"({share:.0%}); step ms: {steps}"]


def loader(r: dict) -> list[str]:
    out = []
    for mode, res in r.get("images_per_s", {}).items():
        cells = [f"{name} {rate:.0f}" for name, rate in res.get("median", {}).items()]
        out.append(f"{mode} images/s: " + "; ".join(cells))
    return out


def decode(r: dict) -> list[str]:
    return [f"full decode {r.get('full_decode_per_core', 0):.0f} images/s/core x {r.get('cores')} cores = "
            f"{r.get('decode_limit', 0):.0f} images/s"]


def collate(r: dict) -> list[str]:
    share = r.get("share_of_memcpy", {})
    return [f"fast_collate {share.get('new', 0):.0%} of memcpy (new buffer), {share.get('reused', 0):.0%} "
            f"(reused); {r.get('vs_default', 0):.1f}x default_collate"]


def tune(r: dict) -> list[str]:
    best = r.get("best", {})
    out = [f"best: batch {best.get('batch_size')}, {best.get('num_workers')} workers, {best.get('backend')}: "
           f"{r.get('best_samples_per_s', 0):.0f} samples/s"]
    if "model" in r:
        m = r["model"]
        out.append(f"model {m['name']}: largest batch that fits {m['max_batch_size']}, {m['samples_per_s']:.0f} "
                   f"samples/s at batch {m['batch_size']}")
    return out


def generic(r: dict) -> list[str]:
    numbers = [f"{k} {v:.4g}" for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return ["; ".join(numbers)[:300]] if numbers else []


HEADLINES = {"bench_gpu_train": gpu_train, "bench_h2d": h2d, "bench_loader": loader, "bench_decode": decode,
             "bench_collate": collate, "tune": tune}


def summary(jsonl: str) -> list[str]:
    with open(jsonl) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in records if "step" in r]
    failed = [s for s in steps if s["rc"] != 0]
    lines = [f"== summary: {len(steps)} steps, {len(failed)} failed ({jsonl})"]
    for s in steps:
        state = "ok  " if s["rc"] == 0 else ("TIME" if s["rc"] in (124, 137) else "FAIL")
        lines.append(f"  {state} {s['step']:18s} {s['seconds']:5d} s  {s['last'][:90]}")
    for r in records:
        name = r.get("benchmark")
        if name is None:
            continue
        try:
            heads = HEADLINES.get(name, generic)(r)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            heads = [f"(no headline: {type(e).__name__}: {e})"]
        quick = " (quick)" if r.get("quick") else ""
        lines += [f"  {name}{quick}: {h}" for h in heads[:6]]
    return lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["--record"]:
        jsonl, step, rc, seconds, output = argv[1:6]
        append(jsonl, {"step": step, "rc": int(rc), "seconds": int(seconds), "last": last_line(output)})
        return 0
    if argv[:1] == ["--append"]:
        jsonl, name, path = argv[1:4]
        with open(path) as f:
            append(jsonl, {"benchmark": name, **json.load(f)})
        return 0
    print("\n".join(summary(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
