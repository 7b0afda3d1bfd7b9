"""Loader throughput on real photographs: fastload against the timm-style, classic
torchvision-style and DALI CPU pipelines, same images, batch size and cores, in one run.

Train: RandomResizedCrop 224 (antialiased resize), horizontal flip, collate.
Eval: resize the shorter side to 256, centre crop 224, collate.
The hand-off is each pipeline's own batch: uint8 N×C×H×W (fastload, timm; normalization
left to the GPU), uint8 N×H×W×C (DALI), float32 normalized N×C×H×W (classic, and the
fastload "float" rows that normalize on the CPU). Pipelines run one epoch each in turn,
for several interleaved rounds; the median round is reported, with the range.
"""

from __future__ import annotations

import glob
import inspect
import os
import time

import torch
from common import loader_parser, median, photo_folder, photo_set_record, report
from peers import ClassicDataset, DaliBatches, TimmDataset, dali_version, timm_fast_collate

import fastload as fl
from fastload.system import available_cpus


def epoch_rate(batches) -> float:
    """images/s of one pass over ``batches``, from iter() to the last batch."""
    start, images = time.perf_counter(), 0
    for x, _ in batches:
        images += x.shape[0]
    return images / (time.perf_counter() - start)


def full_decoder() -> tuple[str, object]:
    """The one-core full decode the decode limit is counted in: PyTurboJPEG where it and
    libturbojpeg load, else fastload's default decoder (named in the output)."""
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        return "PyTurboJPEG", lambda b: tj.decode(b, pixel_format=turbojpeg.TJPF_RGB)
    except (ImportError, OSError, RuntimeError) as e:  # RuntimeError: no libturbojpeg found
        from fastload.decode import default_backend, get_decoder

        name = default_backend()
        print(f"PyTurboJPEG unavailable ({type(e).__name__}: {e}); decode limit from fastload's {name} decoder")
        dec = get_decoder(name)
        return f"fastload {name}", lambda b: dec.decode(b)


def full_decode_rate(paths: list[str], passes: int) -> tuple[float, str]:
    """One-core full decode to RGB (images/s, decoder), median of passes after a warm-up."""
    name, decode = full_decoder()
    blobs = [open(p, "rb").read() for p in paths]
    times = []
    for i in range(passes + 1):
        start = time.perf_counter()
        for b in blobs:
            decode(b)
        if i:
            times.append(time.perf_counter() - start)
    return len(blobs) / median(times), name


def fastload_pipelines(root: str, train: bool, bs: int, workers: int) -> dict:
    size = 224
    make = fl.transforms.train if train else fl.transforms.eval
    variants = {"": {}, ", full decode": {"reduced_decode": False}}
    if "antialias" in inspect.signature(make).parameters:
        variants[", antialias=False"] = {"antialias": False}
    loaders = {}
    for suffix, kw in variants.items():
        ds = fl.ImageFolder(root, transform=make(size, **kw))
        backends = ("process", "thread") if suffix != ", antialias=False" else ("process",)
        for backend in backends:
            loaders[f"fastload {backend} uint8{suffix}"] = fl.Loader(
                ds, batch_size=bs, num_workers=workers, normalize=False, shuffle=True, backend=backend, device="cpu")
    ds = fl.ImageFolder(root, transform=make(size))
    loaders["fastload process float (CPU normalize)"] = fl.Loader(ds, batch_size=bs, num_workers=workers,
                                                                  normalize=True, shuffle=True, device="cpu")
    return loaders


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


def run_mode(root: str, train: bool, bs: int, workers: int, rounds: int, dali: bool) -> dict:
    pipelines = {**fastload_pipelines(root, train, bs, workers), **peer_pipelines(root, train, bs, workers, dali)}
    for batches in pipelines.values():  # warm-up epoch: workers started, buffers in place
        epoch_rate(batches)
    runs: dict = {name: [] for name in pipelines}
    for r in range(1, rounds + 1):
        for name, batches in pipelines.items():
            if isinstance(batches, fl.Loader):
                batches.set_epoch(r)
            runs[name].append(epoch_rate(batches))
    for batches in pipelines.values():
        if isinstance(batches, fl.Loader):
            batches.close()
    return runs


def print_table(mode: str, runs: dict, limit: float) -> dict:
    med = {name: median(v) for name, v in runs.items()}
    timm, classic = med["timm-style uint8"], med["classic float (torchvision-style)"]
    print(f"{mode}: images/s, median of {len(next(iter(runs.values())))} rounds (range)")
    print(f"  {'pipeline':42s} {'median':>7s} {'range':>11s} {'vs timm':>8s} {'vs classic':>10s} {'decode limit':>12s}")
    for name, rate in med.items():
        span = f"{min(runs[name]):.0f}–{max(runs[name]):.0f}"
        print(f"  {name:42s} {rate:7.0f} {span:>11s} {rate / timm:7.2f}x {rate / classic:9.2f}x {rate / limit:11.0%}")
    return med


def main() -> None:
    p = loader_parser(__doc__)
    p.set_defaults(batch_size=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-dali", action="store_true", help="leave DALI out even where it is installed")
    args = p.parse_args()
    root = photo_folder(args)
    rounds = 1 if args.quick else args.rounds
    bs, workers = (8, 2) if args.quick else (args.batch_size, args.workers)
    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    version = None if args.no_dali else dali_version()
    if version is None:
        print("DALI: not included (nvidia-dali-cuda120 not installed here, or --no-dali; `make bench` installs it)")
    per_core, decoder = full_decode_rate(paths, 1 if args.quick else 3)
    limit = per_core * workers
    results = {}
    for mode, train in (("train", True), ("eval", False)):
        runs = run_mode(root, train, bs, workers, rounds, version is not None)
        results[mode] = {"median": print_table(mode, runs, limit), "rounds": runs}
    print(f"({len(paths)} photos, batch {bs}, {workers} workers/threads on {available_cpus()} CPUs, one epoch per "
          f"pipeline per round after a warm-up epoch; decode limit = {workers} x {per_core:.0f} images/s one-core "
          f"{decoder} full decode = {limit:.0f} images/s{'' if version is None else f'; DALI {version}'})")
    report("bench_loader", args, {"images_per_s": results, "decode_limit": limit, "full_decode_per_core": per_core, "full_decoder": decoder,
                                  "batch_size": bs, "workers": workers, "images": len(paths), "dali": version,
                                  "dataset": photo_set_record(root)})


if __name__ == "__main__":
    main()
