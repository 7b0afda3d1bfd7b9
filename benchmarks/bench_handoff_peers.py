"""Issue 34 at hand-off: fastload's Loader against every peer, first epoch and later ones apart,
on the ImageNet-sized photo set and on 2-8 MP photos, in one run (issue 34's targets and
issue 39's, printed apart).

Every pipeline: 2 workers (processes or threads), RandomResizedCrop 224 (antialiased) +
horizontal flip, uint8 batches handed to this (the training) process on the CPU. The photo
sets: ``fastload.photos.jpegs.make_photo_dataset`` (as ``bench_loader.py``) and
``common.large_photos`` (real photographs tiled at native scale, 2-8 MP, quality 85-95).

Rows: fastload's default, a second default loader (its ratio to the first is the run's
noise), and the default with each switch a user can flip (the thread backend,
``reduced_decode=False``, the other libjpeg-turbo decoder where it loads,
``FASTLOAD_NO_CALIBRATION=1``: ``bench_loader``'s variants), the default over the same photos
verified once (``fastload verify --manifest``, kept beside the set: each batch's checksums
matched, then the cheapest decode the crop allows; issue 39); the peers where installed:
timm-style (``peers.TimmDataset``, Pillow, 2 DataLoader workers), DALI's CPU pipeline with ROI
decode (``peers.DaliBatches``, ``make bench``), SPDL's thread pipeline (``peers.SpdlBatches``,
``pip install spdl``, FFmpeg libraries) and FFCV 1.0.2 in a venv of its own (``make
bench-ffcv`` makes it, after Debian's pkg-config, libturbojpeg0-dev and libopencv-dev;
``--ffcv-python`` or ``FASTLOAD_FFCV_PYTHON`` names its python, default
``/work/ffcv-venv/bin/python``): ``ffcv_peer.py``, run by that python, writes the set's
``.beton`` once, beside it, before the rounds, then in each round times its ``Loader``'s first
epoch and later ones as this process times the others (its docstring has the pipeline); where
that python is missing or FFCV does not import in it, FFCV is named as not run, with why. The
full-decode limit is 2 x one core's full-decode rate of the same photos
(``bench_loader.full_decoder``), one pass per round.

Each round runs the rows one after another, in an order reversed every other round (ABBA).
A row's pipeline is built anew, its first epoch timed from the constructor to its last batch
(worker start-up included, as a user's first epoch), then ``--later-epochs`` epochs timed
from ``iter()``, then it is closed: a pipeline's first epoch and its later ones are seconds
apart, so the machine's drift does not come between them, and no other pipeline's workers are
alive meanwhile. Medians over rounds are printed, with the range, by wall time (images/s), by
wall time after the first wave of batches (one per worker: start-up left out, so a first
epoch and a later one compare their decoding), and by CPU time of this process and its
workers (images per CPU-second: robust to other jobs on the machine; the limit's is one
core's). The last lines of each set print the default's ratios against issue 34's targets.

    python benchmarks/bench_handoff_peers.py                  # both sets, 5 rounds: ~25 min
    python benchmarks/bench_handoff_peers.py --set photos     # ~5 min
    python benchmarks/bench_handoff_peers.py --set large      # ~20 min (+1-2 to make the photos once)

(Times estimated for the 2-core machine when idle, from a shorter run on it when busy.)
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable

import torch
from bench_loader import DEFAULT, SETTLE, fastload_variants, full_decoder, switched
from common import large_photos, median, parser, photo_folder, photo_set_record, report, tree_cpu_seconds
from peers import DaliBatches, SpdlBatches, TimmDataset, dali_version, spdl_version, timm_fast_collate

import fastload as fl
from fastload.decode import default_backend, get_decoder, plan, roi

LIMIT = "full-decode limit (2 x one core's full decode)"
FFCV = "FFCV"
#: FFCV's interpreter where --ffcv-python and FASTLOAD_FFCV_PYTHON name none (``make bench-ffcv`` makes it).
FFCV_PYTHON = "/work/ffcv-venv/bin/python"
FFCV_PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ffcv_peer.py")
TIMM, DALI, SPDL = "timm-style uint8 (Pillow)", "DALI CPU, ROI decode", "SPDL thread pipeline"
SECOND = "fastload process uint8 (default, a second loader)"
MEASURES = {"wall": "by wall time, images/s", "steady": "by wall time after the first batches, images/s",
            "cpu": "by CPU time, images per CPU-second"}
#: Issue 34's targets at hand-off: the default / the row (the limit: the default's share of it).
TARGETS = {"photos": {TIMM: 2.5, DALI: 2.0, "FFCV": 2.0, LIMIT: 0.75}, "large": {DALI: 2.0, LIMIT: 3.0}}
FIRST_OF_LATER, OF_SWITCH = 0.95, 0.97
VERIFIED = "fastload process uint8, verified (fastload verify)"
#: Issue 39's: (label, numerator row, denominator row, target); the limit's row is 2 cores' full decodes.
ISSUE39 = {
    "photos": [("verified / default (strict)", VERIFIED, DEFAULT, 1.0)],
    "large": [
        ("verified / default (strict)", VERIFIED, DEFAULT, 1.0),
        (f"verified / {DALI}", VERIFIED, DALI, 1.5),
        ("verified's share of the full-decode limit", VERIFIED, LIMIT, 1.6),
        ("default (strict)'s share of the full-decode limit", DEFAULT, LIMIT, 1.35),
    ],
}


def timed_epoch(make: Callable[[], Iterable], wave: int) -> dict:
    """Images, wall and CPU seconds of one pass over ``make()`` (called inside the timing: a
    constructor, or a lambda returning a pipeline built earlier), and the wall seconds and
    images at each of its first ``wave`` batches."""
    time.sleep(SETTLE)  # threads a pipeline left busy would count against the next one
    start, cpu = time.perf_counter(), tree_cpu_seconds()
    batches = make()
    images, arrivals = 0, []
    for x, _ in batches:
        images += x.shape[0]
        if len(arrivals) < wave:
            arrivals.append((time.perf_counter() - start, images))
    wall = time.perf_counter() - start
    return {"pipeline": batches, "images": images, "wall": wall, "cpu": tree_cpu_seconds() - cpu,
            "arrivals": arrivals}


def rates(e: dict) -> dict:
    """An epoch's images/s (from its start, and after its first wave of batches: one per worker,
    which 2 processes build at once) and images per CPU-second."""
    at, done = e["arrivals"][-1]
    after = e["images"] - done
    return {"wall": e["images"] / e["wall"], "cpu": e["images"] / max(e["cpu"], 1e-3),
            "steady": after / (e["wall"] - at) if after else None, "first_batch_ms": e["arrivals"][0][0] * 1e3}


def decode_pass(paths: list[str], workers: int) -> dict:
    """The limit's rates from one one-core pass of full decodes (files read before timing)."""
    decode, _ = full_decoder()
    blobs = [open(p, "rb").read() for p in paths]
    time.sleep(SETTLE)
    start, cpu = time.perf_counter(), time.thread_time()
    for b in blobs:
        decode(b)
    per_core = len(blobs) / (time.perf_counter() - start)
    limit = per_core * workers
    return {"wall": limit, "steady": limit, "cpu": len(blobs) / (time.thread_time() - cpu), "first_batch_ms": None}


def verified_manifest(root: str) -> str:
    """``fastload verify``'s manifest of ``root``, written once beside it (``ROOT.verified.json``)."""
    from fastload.cli import main as cli

    manifest = os.path.abspath(root).rstrip(os.sep) + ".verified.json"
    if not os.path.exists(manifest) and cli(["verify", root, "--quiet", "--manifest", manifest]) != 0:
        raise RuntimeError(f"fastload verify {root} failed: a photo of the set does not decode strictly")
    return manifest


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def ffcv_peer(python: str | None, root: str, workers: int) -> tuple[dict | None, str | None]:
    """FFCV's versions and the .beton of ``root`` (``ffcv_peer.py`` writes it once, in FFCV's venv),
    or None and why FFCV's row is not run."""
    how = ("`make bench-ffcv` makes FFCV's venv (Debian's pkg-config, libturbojpeg0-dev and libopencv-dev first); "
           "--ffcv-python or FASTLOAD_FFCV_PYTHON names another interpreter")
    if not python:
        return None, f"no interpreter for FFCV was named ({how})"
    if not os.path.exists(python):
        return None, f"FFCV's interpreter {python} does not exist ({how})"
    probe = subprocess.run([python, FFCV_PEER, "--probe"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return None, f"FFCV does not import in {python}: {last_line(probe.stderr)} ({how})"
    prep = subprocess.run([python, FFCV_PEER, root, "--prepare", "--workers", str(workers)], capture_output=True,
                          text=True, timeout=3600)
    if prep.returncode != 0:
        return None, f"FFCV could not write the .beton of {root} ({python}): {last_line(prep.stderr)}"
    return {**json.loads(last_line(probe.stdout)), **json.loads(last_line(prep.stdout)), "python": python}, None


class FfcvRow:
    """FFCV's pipeline in its own venv: one ``ffcv_peer.py`` process a round, which times its first
    epoch from the ``Loader`` constructor and the later ones from ``iter()`` as ``timed_epoch`` does."""

    def __init__(self, info: dict, root: str, bs: int, workers: int) -> None:
        self.info, self.root, self.bs, self.workers = info, root, bs, workers

    def run(self, later_epochs: int, wave: int) -> tuple[dict, list[dict]]:
        cmd = [self.info["python"], FFCV_PEER, self.root, "--batch-size", str(self.bs), "--workers",
               str(self.workers), "--later-epochs", str(later_epochs), "--wave", str(wave), "--settle", str(SETTLE)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"FFCV's row failed ({' '.join(cmd)}): {proc.stderr[-2000:]}")
        out = json.loads(last_line(proc.stdout))
        return out["first"], out["later"]


def pipelines(root: str, paths: list[str], bs: int, workers: int, args) -> tuple[dict, dict]:
    """name -> (constructor, environment switch or None), and name -> why a row is not run."""
    rows: dict = {}
    for name, (tf_kw, loader_kw, env, compared) in fastload_variants(train=True).items():
        if (name != DEFAULT and not compared) or env == "FASTLOAD_ROI=trusted":  # deprecated: the verified row
            continue
        kw = dict(loader_kw)
        decoder = kw.pop("decoder", None)

        def make(tf_kw=tf_kw, kw=kw, decoder=decoder):
            ds = fl.ImageFolder(root, transform=fl.transforms.train(224, **tf_kw), decoder=decoder)
            return fl.Loader(ds, batch_size=bs, num_workers=workers, normalize=False, shuffle=True,
                             device="cpu", **kw)

        rows[name] = (make, env)
    # The photos verified once (`fastload verify --manifest`, kept beside the set, not in it: the
    # other rows read the folder unverified): checksums matched, decodes as the crop allows.
    manifest = verified_manifest(root)

    def make_verified() -> fl.Loader:
        ds = fl.ImageFolder(root, transform=fl.transforms.train(224), verified=manifest)
        assert ds.verified_count == len(ds), (ds.verified_count, len(ds))
        return fl.Loader(ds, batch_size=bs, num_workers=workers, normalize=False, shuffle=True, device="cpu")

    rows[VERIFIED] = (make_verified, None)
    skipped = {}
    if not roi.available():
        skipped["region decodes of verified rows"] = "nvImageCodec is not installed (the roi extra)"
    other = "turbojpeg" if default_backend() == "simplejpeg" else "simplejpeg"
    try:
        get_decoder(other)
    except ImportError as e:
        skipped[f"fastload, decoder={other!r}"] = str(e).splitlines()[0]
    classes = sorted({os.path.basename(os.path.dirname(p)) for p in paths})
    labels = [classes.index(os.path.basename(os.path.dirname(p))) for p in paths]
    rows[TIMM] = (lambda: torch.utils.data.DataLoader(
        TimmDataset(paths, labels, True), batch_size=bs, num_workers=workers, persistent_workers=True,
        shuffle=True, collate_fn=timm_fast_collate), None)
    version = None if args.no_dali else dali_version()
    if version is None:
        skipped[DALI] = ("--no-dali" if args.no_dali else
                         "nvidia-dali-cuda120 is not installed (`make bench` installs it)")
    else:
        rows[f"{DALI} ({version})"] = (lambda: DaliBatches(root, True, bs, workers), None)
    version = spdl_version()
    if version is None:
        skipped[SPDL] = ("spdl is not installed (pip install spdl)" if importlib.util.find_spec("spdl") is None
                         else "spdl's FFmpeg bindings do not load (it needs the system's FFmpeg 4-8 libraries)")
    else:
        rows[f"{SPDL} ({version})"] = (lambda: SpdlBatches(paths, labels, bs, workers), None)
    info, why = ffcv_peer(args.ffcv_python, root, workers)
    if info is None:
        skipped["FFCV 1.0.2"] = why
    else:
        rows[f"{FFCV} ({info['ffcv']}, its own venv)"] = (FfcvRow(info, root, bs, workers), None)
    return rows, skipped


def run_set(root: str, bs: int, workers: int, rounds: int, later_epochs: int, args) -> tuple[dict, dict]:
    """Per row: its first epochs' and later epochs' rates over the rounds (see the module docstring)."""
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".jpg"))
    rows, skipped = pipelines(root, paths, bs, workers, args)
    order = [*rows, LIMIT]
    runs: dict = {name: {"first": [], "later": []} for name in order}
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:  # ABBA: drift hits all rows alike
            if name == LIMIT:
                limit = decode_pass(paths, workers)
                runs[name]["first"].append(limit)
                runs[name]["later"].append(limit)
                continue
            make, env = rows[name]
            if isinstance(make, FfcvRow):  # a process of FFCV's venv times its epochs
                first, later = make.run(later_epochs, workers)
                runs[name]["first"].append(rates(first))
                runs[name]["later"] += [rates(e) for e in later]
                continue
            with switched(env):  # a switch read in the workers is set while they start
                e = timed_epoch(make, workers)
            batches = e.pop("pipeline")
            runs[name]["first"].append(rates(e))
            for k in range(1, later_epochs + 1):
                if isinstance(batches, fl.Loader):
                    batches.set_epoch(k)
                runs[name]["later"].append(rates(timed_epoch(lambda b=batches: b, workers)))
            if isinstance(batches, fl.Loader):
                batches.close()
            batches = None
            gc.collect()  # DataLoader workers and DALI's threads end with their objects
    return runs, skipped


def medians(runs: dict, measure: str) -> dict:
    """name -> {first, later: (median, low, high) or None}."""
    out = {}
    for name, phases in runs.items():
        out[name] = {}
        for phase, values in phases.items():
            v = [x[measure] for x in values if x[measure] is not None]
            out[name][phase] = (median(v), min(v), max(v)) if v else None
    return out


def show(title: str, runs: dict, skipped: dict, target_set: str) -> dict:
    print(f"\n{title}")
    for name, why in skipped.items():
        print(f"  not run: {name}: {why}")
    summary = {}
    for measure, unit in MEASURES.items():
        med = medians(runs, measure)
        print(f"  {unit}: median (range) of {len(runs[LIMIT]['first'])} rounds")
        print(f"    {'pipeline':58s} {'first epoch':>18s} {'later epochs':>18s} {'first/later':>11s}")
        for name, m in med.items():
            cell = [f"{x[0]:6.0f} ({x[1]:.0f}-{x[2]:.0f})" if x else "-" for x in (m["first"], m["later"])]
            ratio = f"{m['first'][0] / m['later'][0]:.2f}" if m["first"] and m["later"] else "-"
            print(f"    {name:58s} {cell[0]:>18s} {cell[1]:>18s} {ratio:>11s}")
        summary[measure] = targets(med, target_set, measure)
    firsts = {n: median([x["first_batch_ms"] for x in runs[n]["first"]]) for n in runs if n != LIMIT}
    print("  first batch, ms from the constructor (first epoch): "
          + ", ".join(f"{n.replace('fastload process uint8', 'fastload')} {v:.0f}" for n, v in firsts.items()))
    return {"medians": {m: medians(runs, m) for m in MEASURES}, "targets": summary, "first_batch_ms": firsts,
            "skipped": skipped}


def targets(med: dict, target_set: str, measure: str) -> dict:
    """Prints and returns the default's ratio to each target row, first epoch and later."""
    print(f"    issue 34's targets, {MEASURES[measure].split(',')[0]} (default / row; first epoch | later epochs):")
    out: dict = {}

    def line(label: str, row: str | None, goal: float | None, top: str = DEFAULT) -> None:
        got = [med[top][p][0] / med[row][p][0] if row and med[top][p] and med[row][p] else None
               for p in ("first", "later")]
        marks = " | ".join("-" if g is None else f"{g:.2f}{'' if goal is None else ' ok' if g >= goal else ' NOT MET'}"
                           for g in got)
        print(f"      {label:62s} {marks}{'' if goal is None else f'  (target >= {goal})'}")
        out[label] = got

    for key, goal in TARGETS[target_set].items():
        row = next((n for n in med if n.startswith(key)), None)
        if row is None:
            print(f"      {key:62s} not run, see above  (target >= {goal})")
            continue
        line(row if key != LIMIT else "share of the full-decode limit", row, goal)
    for name in med:
        if name.startswith((SPDL, FFCV)) and not any(name.startswith(k) for k in TARGETS[target_set]):
            line(f"{name} (no target)", name, None)
        if name.startswith("fastload") and name not in (DEFAULT, SECOND, VERIFIED):
            line(f"vs {name[len('fastload '):]}", name, OF_SWITCH)
    line("vs a second default loader (the run's noise)", SECOND, None)
    print(f"    issue 39's targets, {MEASURES[measure].split(',')[0]} (row / row; first epoch | later epochs):")
    for label, top, row, goal in ISSUE39[target_set]:
        found = next((n for n in med if n.startswith(row)), None)
        if top not in med or found is None:
            print(f"      {label:62s} not run, see above  (target >= {goal})")
            continue
        line(label, found, goal, top)
    d = med[DEFAULT]
    first_later = d["first"][0] / d["later"][0] if d["first"] and d["later"] else None
    print(f"      {'first epoch / later epochs':62s} {'-' if first_later is None else f'{first_later:.2f}'}"
          f"{'' if first_later is None else ' ok' if first_later >= FIRST_OF_LATER else ' NOT MET'}"
          f"  (target >= {FIRST_OF_LATER})")
    out["first / later"] = first_later
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--set", choices=("both", "photos", "large"), default="both")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--later-epochs", type=int, default=2, help="epochs timed per round after the first")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128, help="on the photo set")
    p.add_argument("--large", type=int, default=400, help="2-8 MP photos")
    p.add_argument("--large-batch-size", type=int, default=32)
    p.add_argument("--no-dali", action="store_true", help="leave DALI out even where it is installed")
    p.add_argument("--ffcv-python", default=os.environ.get("FASTLOAD_FFCV_PYTHON") or FFCV_PYTHON,
                   help="the Python of FFCV's venv (default: $FASTLOAD_FFCV_PYTHON, else %(default)s)")
    args = p.parse_args()
    rounds, later = (1, 1) if args.quick else (args.rounds, args.later_epochs)
    plan.get_planner()  # the decode costs calibrated (once per machine) before any timing
    out = {}
    if args.set in ("both", "photos"):
        root = photo_folder(args, quiet=True)
        bs = 8 if args.quick else args.batch_size
        runs, skipped = run_set(root, bs, args.workers, rounds, later, args)
        stats = photo_set_record(root)
        out["photos"] = {**show(f"ImageNet-sized photo set: {stats['images']} photos, {stats['megapixels']:.2f} MP "
                                f"mean; batch {bs}", runs, skipped, "photos"), "rounds": runs, "dataset": stats}
    if args.set in ("both", "large"):
        n = 4 if args.quick else args.large
        root = large_photos(os.path.join(args.data, f"large{n}"), n)
        bs = 1 if args.quick else args.large_batch_size  # 4 batches: some after the first wave
        runs, skipped = run_set(root, bs, args.workers, rounds, later, args)
        stats = photo_set_record(root)
        title = f"2-8 MP photos: {stats['images']} photos, {stats['megapixels']:.2f} MP mean; batch {bs}"
        out["large"] = {**show(title, runs, skipped, "large"), "rounds": runs, "dataset": stats}
    print(f"\n({args.workers} workers; default decoder {default_backend()}; full decode by {full_decoder()[1]}; "
          f"region decode {'nvImageCodec ' + str(roi.version()) if roi.available() else 'off'})")
    report("bench_handoff_peers", args, {"sets": out, "workers": args.workers, "decoder": default_backend()})


if __name__ == "__main__":
    main()
