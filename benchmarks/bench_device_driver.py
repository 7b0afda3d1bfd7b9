"""The device driver on the CPU device, this checkout against another (e.g. the old main).

Each checkout runs in its own child process (fastload imported from that tree); the parent
alternates the two, round by round in ABBA order, on the same workloads, and prints each
workload's median time per batch and the ratio old / new (> 1: this checkout is faster).
Every batch a child hands out is hashed (its bytes, dtype and shape): the parent checks the
two checkouts' batches are identical, bit for bit.

Workloads (all on the CPU device):
  prefetch-float32  ``CudaPrefetcher`` over 24 host batches 64×96×96×3, normalized to float32
  prefetch-uint8    the same over 400 batches 16×12×12×3, not normalized: the per-batch overhead
  loader-thread     ``Loader`` over 480 small synthetic images, thread backend, 1 worker,
                    mean/std/bfloat16 of its own, return_index
  loader-process    the same, 0 workers (the main process loads)
  loader-photos     ``Loader`` over 48 real photos, ``transforms.train(64)``, 0 workers
  gpu-decode-on-cpu ``decode="gpu"`` over the same photos with nvImageCodec's CPU backend

Usage: ``git archive <old-commit> fastload | tar -x -C /tmp/old`` then
``python benchmarks/bench_device_driver.py --old /tmp/old``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ("prefetch-float32", "prefetch-uint8", "loader-thread", "loader-process", "loader-photos",
             "gpu-decode-on-cpu")


# ---- the child: fastload from one tree -------------------------------------------------------


def _import_from(tree: str):
    # An editable install's finder would win over sys.path: drop it, then import from ``tree``.
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
    sys.path.insert(0, tree)
    import fastload

    if not fastload.__file__.startswith(os.path.abspath(tree)):
        raise SystemExit(f"fastload imported from {fastload.__file__}, not {tree}")
    return fastload


def _digest(out) -> str:
    h = hashlib.sha256()
    for t in out:
        for v in (t if isinstance(t, list) else [t]):
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(v.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class _Pixels:
    """Distinct random images, a fastload dataset (load)."""

    def __init__(self, n: int, shape: tuple[int, int, int]) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def load(self, index: int, epoch: int = 0, seed: int = 0):
        import numpy as np

        rng = np.random.default_rng([index, epoch, seed])
        return rng.integers(0, 256, self.shape, dtype=np.uint8), index % 7


def _make(fl, name: str, photos: str):
    """A function running one pass of workload ``name``: (batches, digests)."""
    import warnings

    import torch

    warnings.simplefilter("ignore", DeprecationWarning)  # old option spellings, where renamed
    if name.startswith("prefetch"):
        from fastload.batch import HostBatch

        n, shape = (24, (64, 96, 96, 3)) if name == "prefetch-float32" else (400, (16, 12, 12, 3))
        g = torch.Generator().manual_seed(0)
        batches = [HostBatch(torch.randint(0, 256, shape, dtype=torch.uint8, generator=g),
                             torch.arange(shape[0]), torch.arange(shape[0]) + i, 0) for i in range(n)]
        norm = fl.Normalizer(normalize=name == "prefetch-float32")
        prefetcher = fl.CudaPrefetcher((), device="cpu", normalizer=norm, indices=True)
        return lambda: [_digest(out) for out in prefetcher.run(batches)], None
    if name.startswith("loader-"):
        common = dict(batch_size=32, shuffle=True, seed=5, device="cpu", stall_warning=0, return_index=True)
        if name == "loader-photos":
            ds = fl.ImageFolder(photos, transform=fl.transforms.train(64))
            loader = fl.Loader(ds, num_workers=0, **common)
        else:
            extra = dict(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), dtype="bfloat16")
            workers = dict(backend="thread", num_workers=1) if name == "loader-thread" else dict(num_workers=0)
            loader = fl.Loader(_Pixels(480, (20, 18, 3)), **common, **extra, **workers)
    else:
        os.environ["FASTLOAD_GPU_DECODE_ON_CPU"] = "1"
        ds = fl.ImageFolder(photos, transform=fl.transforms.train(64, reduced_decode=False))
        loader = fl.Loader(ds, decode="gpu", batch_size=16, num_workers=0, shuffle=True, seed=5, device="cpu",
                           return_index=True, stall_warning=0)

    def one_pass():
        loader.set_epoch(0)
        return [_digest(out) for out in loader]

    return one_pass, loader


def child(tree: str, photos: str, passes: int) -> None:
    fl = _import_from(tree)
    runs = {}
    for line in sys.stdin:
        name = line.strip()
        if name not in runs:
            runs[name] = _make(fl, name, photos)[0]
            runs[name]()  # warm-up
        start, cpu = time.perf_counter(), time.process_time()
        digests = [runs[name]() for _ in range(passes)]
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        batches = sum(len(d) for d in digests)
        print(json.dumps({"wall": wall, "cpu": cpu, "batches": batches, "digests": digests[-1]}), flush=True)


# ---- the parent ------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="a tree holding the old fastload/ (e.g. git archive's)")
    p.add_argument("--new", default=ROOT, help="the tree under test (default: this checkout)")
    p.add_argument("--rounds", type=int, default=6, help="ABBA rounds per workload (default: 6)")
    p.add_argument("--passes", type=int, default=3, help="passes of a workload timed in a round (default: 3)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--data", default=os.path.join(ROOT, "data", "sample"))
    p.add_argument("--quick", action="store_true", help="2 rounds of the smallest workload (checks the script runs)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--photos", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.photos, args.passes)
    if args.quick:
        args.rounds, args.passes, args.workloads = 2, 1, "prefetch-uint8"
    sys.path.insert(0, ROOT)
    from fastload.photos.jpegs import make_photo_dataset

    photos = os.path.join(args.data, "photos48")
    if "loader-photos" in args.workloads or "gpu-decode-on-cpu" in args.workloads:
        make_photo_dataset(photos, num_images=48, num_classes=4)
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    child_args = ["--old", "-", "--passes", str(args.passes), "--photos", photos]
    procs = {k: subprocess.Popen([sys.executable, __file__, *child_args, "--child", t],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for k, t in trees.items()}
    print(f"old: {trees['old']}\nnew: {trees['new']}\n{args.rounds} ABBA rounds per workload, {args.passes} passes "
          f"a round, CPU device; time per batch, median of the rounds (wall / process CPU)")
    identical = True
    try:
        for name in args.workloads.split(","):
            times: dict[str, list] = {"old": [], "new": []}
            digests: dict[str, set] = {"old": set(), "new": set()}
            for r in range(args.rounds):
                for k in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    procs[k].stdin.write(name + "\n")
                    procs[k].stdin.flush()
                    res = json.loads(procs[k].stdout.readline())
                    times[k].append((res["wall"] / res["batches"], res["cpu"] / res["batches"]))
                    digests[k].add(tuple(res["digests"]))
            same = digests["old"] == digests["new"] and len(digests["new"]) == 1
            identical &= same
            old_w, old_c = (statistics.median(t[i] for t in times["old"]) for i in (0, 1))
            new_w, new_c = (statistics.median(t[i] for t in times["new"]) for i in (0, 1))
            print(f"{name:18s} old {1e3 * old_w:8.3f} / {1e3 * old_c:8.3f} ms   new {1e3 * new_w:8.3f} / "
                  f"{1e3 * new_c:8.3f} ms   old/new {old_w / new_w:5.3f} / {old_c / new_c:5.3f}   "
                  f"batches {'identical' if same else 'DIFFER'} ({len(next(iter(digests['new'])))} a pass)")
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    if not identical:
        raise SystemExit("the two trees' batches differ")


if __name__ == "__main__":
    main()
