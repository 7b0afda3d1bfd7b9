"""Loader throughput on real photographs: fastload against the timm-style, classic
torchvision-style and DALI CPU pipelines, same images, batch size and cores, in one run.

Train: RandomResizedCrop 224 (antialiased resize), horizontal flip, collate.
Eval: resize the shorter side to 256, centre crop 224, collate.
The hand-off is each pipeline's own batch: uint8 N×C×H×W (fastload, timm; normalization
left to the GPU), uint8 N×H×W×C (DALI), float32 normalized N×C×H×W (classic, and the
fastload "float" rows that normalize on the CPU). Pipelines run one epoch each in turn,
for several interleaved rounds; the median round is reported, with the range.

Besides the default, fastload runs once per switch a user can flip (the other backend,
``reduced_decode=False``, ``FASTLOAD_ROI=trusted`` (region decodes: not strict), the other libjpeg-turbo decoder,
``FASTLOAD_NO_CALIBRATION=1``), and the last lines print the default's ratio to each:
the default must not be slower than any of them. A second loader of the default
pipeline runs too: its ratio to the first is the noise of the run. ``antialias=False`` (an aliasing
resize: does less) and ``normalize=True`` (does more) are shown, not compared.
Switches read by the planner in each worker process (``FASTLOAD_ROI``,
``FASTLOAD_NO_CALIBRATION``) are set while that loader's workers start (on its warm-up
epoch) and restored after, as a user would set them for the whole run. With
``--busy-calibration`` one more default loader plans with a calibration made while
spinning processes kept every CPU busy (``busy_calibration.py``, made again before each
mode), and its ratio to each switch is printed too (issue 39: a calibration made on a
busy machine must not steer later runs).

Every table is printed twice: by wall time (images/s), and by the CPU time the pipeline's
processes spent (images per CPU-second: the main process, its threads and its worker
processes, from /proc). On a machine shared with other jobs the wall rates swing with
their load; the CPU rates measure the pipelines' own work, and on an idle machine whose
cores they keep busy they give the same ratios. The decode limit is the cores in use
times the one-core full-decode rate, measured both ways in the same run.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from collections.abc import Callable

import busy_calibration
import torch
from common import loader_parser, median, photo_folder, photo_set_record, report, tree_cpu_seconds
from peers import ClassicDataset, DaliBatches, TimmDataset, dali_version, timm_fast_collate

import fastload as fl
from fastload.decode import default_backend, get_decoder, plan, roi
from fastload.system import available_cpus

#: Seconds of rest before each timed epoch: threads a pipeline left busy (DALI's, in this
#: process) would otherwise count, in wall and CPU time, against the next one.
SETTLE = 0.5


def epoch_rate(batches) -> tuple[float, float]:
    """(images/s, images per CPU-second of this process and its workers) of one pass over
    ``batches``, from iter() to the last batch."""
    time.sleep(SETTLE)
    start, cpu, images = time.perf_counter(), tree_cpu_seconds(), 0
    for x, _ in batches:
        images += x.shape[0]
    return images / (time.perf_counter() - start), images / max(tree_cpu_seconds() - cpu, 1e-3)


def full_decoder() -> tuple[Callable[[bytes], object], str]:
    """The reference full decode to RGB and its name: PyTurboJPEG over the system
    libjpeg-turbo (the issue's reference), else simplejpeg's."""
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        return (lambda b: tj.decode(b, pixel_format=turbojpeg.TJPF_RGB)), "PyTurboJPEG"
    except (ImportError, OSError, RuntimeError):
        import simplejpeg

        return simplejpeg.decode_jpeg, "simplejpeg"


def full_decode_rate(paths: list[str], passes: int) -> tuple[float, float, str]:
    """One-core full decode to RGB (images/s, and images per CPU-second), medians of passes
    after a warm-up, with :func:`full_decoder`."""
    decode, name = full_decoder()
    blobs = [open(p, "rb").read() for p in paths]
    times, cpu = [], []
    for i in range(passes + 1):
        start, start_cpu = time.perf_counter(), time.thread_time()
        for b in blobs:
            decode(b)
        if i:
            times.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
    return len(blobs) / median(times), len(blobs) / median(cpu), name


#: Environment switches of the variants (process backend: read in its workers), as (name, value).
ROI_TRUSTED = ("FASTLOAD_ROI", "trusted")
NO_CALIBRATION = ("FASTLOAD_NO_CALIBRATION", "1")

#: The default loader planning with a calibration made on a busy machine (--busy-calibration).
BUSY = "fastload process uint8 (default, busy calibration)"


def fastload_variants(train: bool, busy_cache: str | None = None) -> dict:
    """name -> (transform options, Loader options, environment switch or None, compared with the
    default); ``busy_cache``: the cache folder of a calibration made on a busy machine, which one
    more default loader plans with."""
    variants = {
        "fastload process uint8 (default)": ({}, {}, None, False),
        "fastload thread uint8": ({}, {"backend": "thread"}, None, True),
        **({BUSY: ({}, {}, ("FASTLOAD_CACHE_DIR", busy_cache), True)} if busy_cache else {}),
        # The default again, as its own loader: its ratio to the default is the run's noise.
        "fastload process uint8 (default, a second loader)": ({}, {}, None, True),
        "fastload process uint8, reduced_decode=False": ({"reduced_decode": False}, {}, None, True),
    }
    if roi.available():
        # Region decodes for files known intact: faster where they pay, blind to corrupt data.
        variants["fastload process uint8, FASTLOAD_ROI=trusted"] = ({}, {}, ROI_TRUSTED, True)
    other = "turbojpeg" if default_backend() == "simplejpeg" else "simplejpeg"
    try:
        get_decoder(other)
        variants[f"fastload process uint8, decoder={other!r}"] = ({}, {"decoder": other}, None, True)
    except ImportError:
        pass
    variants["fastload process uint8, FASTLOAD_NO_CALIBRATION=1"] = ({}, {}, NO_CALIBRATION, True)
    variants["fastload process uint8, antialias=False (does less)"] = ({"antialias": False}, {}, None, False)
    variants["fastload process float (CPU normalize)"] = ({}, {"normalize": True}, None, False)
    return variants


@contextlib.contextmanager
def switched(env: tuple[str, str] | None):
    """``env`` (name, value) set (and this process's planner dropped, so forked workers build
    theirs under it) for the duration; everything restored after."""
    if env is None:
        yield
        return
    key, value = env
    old = os.environ.get(key)
    os.environ[key] = value
    plan.set_planner(None)
    try:
        yield
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old
        plan.set_planner(None)


def fastload_pipelines(root: str, train: bool, bs: int, workers: int, few: bool,
                       busy: bool = False) -> tuple[dict, set]:
    """The fastload loaders, each warmed up (workers started) under its own switches, and
    the names compared with the default (``few``: the default and the thread backend only;
    ``busy``: one more default loader planning with a calibration made on a busy machine)."""
    make = fl.transforms.train if train else fl.transforms.eval
    loaders, compared = {}, set()
    cache = tempfile.mkdtemp(prefix="fastload-busy-cache-") if busy else None
    if cache is not None:
        print(busy_calibration.describe(busy_calibration.busy_calibration(cache)), flush=True)
    variants = fastload_variants(train, cache)
    for name, (tf_kw, loader_kw, env, compare) in list(variants.items())[: 2 if few else None]:
        decoder = loader_kw.pop("decoder", None)
        ds = fl.ImageFolder(root, transform=make(224, **tf_kw), decoder=decoder)
        options = dict(batch_size=bs, num_workers=workers, normalize=False, shuffle=True, device="cpu")
        loader = fl.Loader(ds, **{**options, **loader_kw})
        with switched(env):
            epoch_rate(loader)  # the warm-up epoch: workers start (and inherit the switch), samples get marked
        loaders[name] = loader
        if compare:
            compared.add(name)
    return loaders, compared


def peer_pipelines(root: str, train: bool, bs: int, workers: int, dali: bool) -> dict:
    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    classes = sorted(os.listdir(root))
    labels = [classes.index(os.path.basename(os.path.dirname(p))) for p in paths]
    common = dict(batch_size=bs, num_workers=workers, persistent_workers=True, shuffle=train)
    peers = {
        "timm-style uint8": torch.utils.data.DataLoader(TimmDataset(paths, labels, train),
                                                        collate_fn=timm_fast_collate, **common),
        "classic float (torchvision-style)": torch.utils.data.DataLoader(ClassicDataset(paths, labels, train),
                                                                         **common),
    }
    if dali:
        peers["DALI CPU uint8 NHWC"] = DaliBatches(root, train, bs, workers)
    return peers


def run_mode(root: str, train: bool, bs: int, workers: int, rounds: int, dali: bool,
             few: bool = False, peers: bool = True, busy: bool = False) -> tuple[dict, set]:
    ours, compared = fastload_pipelines(root, train, bs, workers, few, busy)
    peers = peer_pipelines(root, train, bs, workers, dali) if peers else {}
    for batches in peers.values():  # warm-up epoch: workers started, buffers in place
        epoch_rate(batches)
    pipelines = {**ours, **peers}
    runs: dict = {name: [] for name in pipelines}  # (images/s, images per CPU-second) per round
    for r in range(1, rounds + 1):
        order = list(pipelines.items())
        for name, batches in order if r % 2 else order[::-1]:  # ABBA: drift hits all alike
            if isinstance(batches, fl.Loader):
                batches.set_epoch(r)
            runs[name].append(epoch_rate(batches))
    for batches in pipelines.values():
        if isinstance(batches, fl.Loader):
            batches.close()
    return runs, compared


DEFAULT = "fastload process uint8 (default)"
DALI = "DALI CPU uint8 NHWC"


def print_table(mode: str, runs: dict, limits: tuple[float, float], compared: set) -> dict:
    """The table by wall time and by CPU time, the default's ratio to each switch, and
    the targets; returns the medians and ratios."""
    out = {}
    for k, (unit, limit) in enumerate((("images/s", limits[0]), ("images per CPU-second", limits[1]))):
        rates = {name: [r[k] for r in v] for name, v in runs.items()}
        med = {name: median(v) for name, v in rates.items()}
        # Without the peers (--switches), ratios to them read as ratios to the default.
        timm = med.get("timm-style uint8", med[DEFAULT])
        classic = med.get("classic float (torchvision-style)", med[DEFAULT])
        dali = med.get(DALI)
        print(f"{mode}, {unit}: median of {len(next(iter(runs.values())))} rounds (range)")
        print(f"  {'pipeline':54s} {'median':>7s} {'range':>11s} {'vs timm':>8s} {'vs DALI':>8s} {'vs classic':>10s} "
              f"{'decode limit':>12s}")
        for name, rate in med.items():
            span = f"{min(rates[name]):.0f}–{max(rates[name]):.0f}"
            vs_dali = f"{rate / dali:7.2f}x" if dali else f"{'':8s}"
            print(f"  {name:54s} {rate:7.0f} {span:>11s} {rate / timm:7.2f}x {vs_dali} {rate / classic:9.2f}x "
                  f"{rate / limit:11.0%}")
        ratios = {name: med[DEFAULT] / med[name] for name in med if name in compared}
        print(f"  {mode}, {unit}: the default against each switch (never slower: >= 0.97):")
        for name, ratio in ratios.items():
            print(f"    vs {name[len('fastload '):]:50s} {ratio:5.2f}x  {'ok' if ratio >= 0.97 else 'SLOWER'}")
        busy = {}
        if BUSY in med:
            busy = {name: med[BUSY] / med[name] for name in med if name in compared and name != BUSY}
            print(f"  {mode}, {unit}: the default calibrated on a busy machine against each switch (>= 0.97):")
            for name, ratio in busy.items():
                print(f"    vs {name[len('fastload '):]:50s} {ratio:5.2f}x  {'ok' if ratio >= 0.97 else 'SLOWER'}")
        out["wall" if k == 0 else "cpu"] = {
            "median": med, "default_vs_switch": ratios, "default_vs_timm": med[DEFAULT] / timm,
            "busy_vs_switch": busy if BUSY in med else None,
            "default_vs_dali": med[DEFAULT] / dali if dali else None, "default_of_limit": med[DEFAULT] / limit}
    return out


def print_targets(results: dict) -> None:
    for how in ("wall", "cpu"):
        train, ev = results["train"][how], results["eval"][how]
        dali = f"{train['default_vs_dali']:.2f}x DALI CPU (>= 1.75x)" if train["default_vs_dali"] else "DALI not run"
        print(f"targets (issue 19, this run, by {'wall time' if how == 'wall' else 'CPU time'}): train "
              f"{train['default_of_limit']:.0%} of the decode limit (>= 75%), {train['default_vs_timm']:.2f}x "
              f"timm-style (>= 1.9x), {dali}; eval {ev['default_vs_timm']:.2f}x timm-style (>= 1.6x)")


def main() -> None:
    p = loader_parser(__doc__)
    p.set_defaults(batch_size=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-dali", action="store_true", help="leave DALI out even where it is installed")
    p.add_argument("--switches", action="store_true",
                   help="fastload's variants only (no peers), for more rounds of the default-against-switch ratios")
    p.add_argument("--busy-calibration", action="store_true",
                   help="also the default planning with a calibration made while every CPU was kept busy")
    args = p.parse_args()
    root = photo_folder(args)
    rounds = 1 if args.quick else args.rounds
    bs, workers = (8, 2) if args.quick else (args.batch_size, args.workers)
    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    version = None if args.no_dali else dali_version()
    if version is None:
        print("DALI: not included (nvidia-dali-cuda120 not installed here, or --no-dali; `make bench` installs it)")
    per_core, per_cpu_s, limit_by = full_decode_rate(paths, 1 if args.quick else 3)
    limit = per_core * workers
    results = {}
    for mode, train in (("train", True), ("eval", False)):
        # --quick checks that every variant runs once: in training only.
        runs, compared = run_mode(root, train, bs, workers, rounds, version is not None, args.quick and not train,
                                  not args.switches, args.busy_calibration)
        results[mode] = {**print_table(mode, runs, (limit, per_cpu_s), compared), "rounds": runs}
    print(f"({len(paths)} photos, batch {bs}, {workers} workers/threads on {available_cpus()} CPUs, one epoch per "
          f"pipeline per round after a warm-up epoch; decode limit = {workers} x {per_core:.0f} images/s one-core "
          f"{limit_by} full decode = {limit:.0f} images/s; by CPU time: {per_cpu_s:.0f} images per CPU-second; "
          f"default decoder {default_backend()}, region decode "
          f"{'nvImageCodec ' + str(roi.version()) if roi.available() else 'off'}"
          f"{'' if version is None else f'; DALI {version}'})")
    if not args.switches:
        print_targets(results)
    report("bench_loader", args, {"results": results, "decode_limit": limit, "full_decode_per_core": per_core,
                                  "full_decode_per_cpu_second": per_cpu_s,
                                  "decode_limit_by": limit_by, "decoder": default_backend(),
                                  "region_decode": roi.version() if roi.available() else None,
                                  "batch_size": bs, "workers": workers, "images": len(paths), "dali": version,
                                  "dataset": photo_set_record(root)})


if __name__ == "__main__":
    main()
