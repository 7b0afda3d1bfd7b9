"""Does the tuner's choice hold up? (issue 39)

Runs ``fastload tune DIR --device cpu --save-profile`` as a user does (a subprocess, its
default budget unless ``--budget``), then re-measures the configuration it saved and each
candidate a user would try by hand (batch 64/128/256 x process/thread backend, 2 workers)
as a user runs them: ``fl.Loader(fl.ImageFolder(DIR, fl.transforms.train(224)), ...)``
iterated epoch after epoch, normalized (the default), on the CPU. The saved choice is run
through ``num_workers="auto"`` (the profile), at the batch size the tuner reported.

Each re-measurement builds a Loader, runs one warm-up epoch, then times whole epochs for
``--seconds``; the entries are run interleaved (a repeat's order is the previous one's
reversed: ABBA), ``--repeats`` times, and each figure is the median of its repeats.
Prints each, the ratio choice / best candidate and, where the choice is one of the
candidates, the ratio of its two figures (the re-measurement's own noise).

The profile and the tuner's JSON go to a temporary ``XDG_CACHE_HOME``; the decode-cost
calibration cache stays where it is (``FASTLOAD_CACHE_DIR``, default ``~/.cache/fastload``)
unless ``--fresh-calibration``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, parser, photo_folder, report

import fastload as fl
from fastload.decode.costs import cache_dir as costs_cache_dir

BATCH_SIZES, QUICK_BATCH_SIZES = (64, 128, 256), (8, 16)  # --quick: its 48 photos hold 3 batches of 16


def candidates(sizes: tuple[int, ...]) -> list[tuple[int, str]]:
    return [(bs, backend) for bs in sizes for backend in ("process", "thread")]


def epochs_rate(loader: fl.Loader, seconds: float) -> float:
    """images/s over whole epochs after a warm-up epoch, until ``seconds`` have passed."""
    for _ in loader:  # warm-up: workers started, buffers and caches in place
        pass
    start, images, epoch = time.perf_counter(), 0, 1
    while time.perf_counter() - start < seconds:
        loader.set_epoch(epoch)
        for x, _ in loader:
            images += x.shape[0]
        epoch += 1
    return images / (time.perf_counter() - start)


def run_tuner(root: str, env: dict, budget: float | None, out: str, extra: list[str]) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "fastload", "tune", root, "--device", "cpu", "--save-profile", "--json", out, *extra]
    if budget is not None:
        cmd += ["--budget", f"{budget:g}"]
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    print(done.stdout, end="")
    # tqdm's progress bar is not a terminal here: keep the stderr lines that are not it.
    print("\n".join(line for line in done.stderr.splitlines() if not line.startswith("tuning")), flush=True)
    if done.returncode != 0:
        sys.exit(f"fastload tune exited {done.returncode}: nothing to re-measure")
    with open(out) as f:
        return json.load(f), elapsed


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(images=800)
    p.add_argument("--budget", type=float, default=None, help="the tuner's --budget (default: its own)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each re-measurement")
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per re-measurement")
    p.add_argument("--workers", type=int, default=2, help="workers of the hand-picked candidates")
    p.add_argument("--fresh-calibration", action="store_true", help="recalibrate decode costs in the temp cache")
    args = p.parse_args()
    root = photo_folder(args)
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[:3]}", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-tune-")
    env = {**os.environ, "XDG_CACHE_HOME": tmp, "PYTHONPATH": ROOT}
    if not args.fresh_calibration and not args.quick:  # --quick leaves the user's calibration cache alone
        env["FASTLOAD_CACHE_DIR"] = costs_cache_dir()
    sizes = QUICK_BATCH_SIZES if args.quick else BATCH_SIZES
    extra = ["--batch-sizes", ",".join(map(str, sizes))]
    if args.quick:  # a few seconds: the benchmark still runs, nothing measured
        extra += ["--seconds", "0.3", "--workers", "0,1"]
        args.budget, args.repeats, args.seconds, args.workers = 2.0, 1, 0.2, 1
    tuned, elapsed = run_tuner(root, env, args.budget, os.path.join(tmp, "tune.json"), extra)
    best = tuned["best"]
    print(
        f"tuner: {elapsed:.0f} s wall; chose batch {best['batch_size']}, {best['num_workers']} workers, "
        f"{best['backend']} at {tuned['best_samples_per_s']:.0f} images/s (its figure); "
        f"decision {tuned['decision']['outcome']}",
        flush=True,
    )
    for m in tuned["measurements"]:
        print(
            f"  tuner measured bs={m['batch_size']:>3} w={m['num_workers']} {m['backend']:<7}: "
            f"{m['samples_per_s']:7.0f} images/s (runs {[round(r) for r in m['runs']]})"
        )
    os.environ["XDG_CACHE_HOME"] = tmp  # the Loaders below find the saved profile
    os.environ.setdefault("FASTLOAD_CACHE_DIR", env.get("FASTLOAD_CACHE_DIR", os.path.join(tmp, "fastload")))
    ds = fl.ImageFolder(root, transform=fl.transforms.train(224))
    entries: dict[str, dict] = {"choice": {"batch_size": best["batch_size"], "num_workers": "auto"}}
    for bs, backend in candidates(sizes):
        entries[f"bs={bs} {backend}"] = {"batch_size": bs, "num_workers": args.workers, "backend": backend}
    rates: dict[str, list[float]] = {name: [] for name in entries}
    order = list(entries)
    for r in range(args.repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            with fl.Loader(ds, shuffle=True, device="cpu", **entries[name]) as loader:
                if name == "choice" and r == 0:
                    print(f"choice runs as {loader!r}", flush=True)
                rates[name].append(epochs_rate(loader, args.seconds))
    medians = {name: statistics.median(v) for name, v in rates.items()}
    print(f"re-measured ({args.repeats} interleaved repeats, {args.seconds:g} s of whole epochs each, medians):")
    for name, v in rates.items():
        print(f"  {name:<12} {medians[name]:7.0f} images/s  (repeats {[round(x) for x in v]})")
    best_name = max((n for n in medians if n != "choice"), key=medians.__getitem__)
    print(
        f"choice / best ({best_name}): {medians['choice'] / medians[best_name]:.2f}x; tuner wall time {elapsed:.0f} s"
    )
    # The choice is one of the candidates too (when it has 2 workers): the two figures of one
    # configuration show the re-measurement's own noise, which choice / best includes.
    same = [
        n
        for n, e in entries.items()
        if n != "choice" and e["batch_size"] == best["batch_size"] and e.get("backend") == best["backend"]
    ]
    if same and best["num_workers"] == args.workers:
        print(f"choice / {same[0]} (the same configuration): {medians['choice'] / medians[same[0]]:.2f}x")
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    print(f"load average after: {load_after}", flush=True)
    report(
        "bench_tune_choice",
        args,
        {
            "tuner_wall_s": elapsed,
            "tuner": {
                "best": best,
                "best_samples_per_s": tuned["best_samples_per_s"],
                "decision": tuned["decision"]["outcome"],
                "measurements": tuned["measurements"],
            },
            "remeasured": rates,
            "medians": medians,
            "best_candidate": best_name,
            "choice_over_best": medians["choice"] / medians[best_name],
            "load_after": load_after,
        },
    )


if __name__ == "__main__":
    main()
