"""The batch-plan redesign (issue 33) against the code before it: same photos, same settings,
one run, interleaved.

The old code is a checkout of it (``git worktree add --detach ../old <commit>``), given with
``--old``. Each version runs in a process of its own (two ``fastload`` packages cannot share
one), holding one Loader per case; the driver has them run one epoch at a time, in turn
(ABBA over versions and cases, so drift hits all alike), and reports the median over the
rounds of images/s (wall) and images per CPU-second (the process, its threads and its
workers, from /proc), and the new version's ratio to the old for each case:

- train (RandomResizedCrop 224 + flip) and eval (resize 256, centre crop 224) on an
  ImageFolder of real photos, process and thread backends (the thread backend now decodes
  a batch's regions in one call, as the process backend did);
- WebDataset shards of the same photos (train: shuffled; its batches now planned, regions
  decoded in one call).

It also reports the median time from the start of an epoch to its first batch (a pass's
start-up: new workers, or persistent ones resumed).

With ``--roi trusted`` both versions run with ``FASTLOAD_ROI=trusted`` (files trusted intact:
region decodes planned): the thread backend's and WebDataset's batches then decode their
regions in one call, as only the process backend did before.

The target (issue 33): new >= 0.98x old for train and eval on both backends. On a machine
shared with other jobs the wall rates swing with their load: read the CPU-time ratios, and
re-run on a quiet machine for the record.

Usage: ``python benchmarks/bench_old_new.py --old ../old [--rounds 7] [--workers N] [--roi trusted]
[--cases "wds process"]``;
``--quick`` runs a few batches of each case once, to check that it still runs.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("folder process", "folder thread", "wds process")
SETTLE = 0.5  # seconds of rest before each timed epoch (threads of the previous one wind down)


# ---- the child: one version of fastload, one Loader per case ----------------------------------


def child(code: str) -> None:
    """Serves the driver: a JSON command per line on stdin, a JSON answer per line on stdout."""
    sys.path.insert(0, code)
    import fastload as fl  # the version under test: imported before common puts this checkout first

    sys.path.insert(1, HERE)
    from common import tree_cpu_seconds

    def cpu_seconds() -> float:
        """This process, its live descendants, and the workers it has joined (a stream's)."""
        return tree_cpu_seconds() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])

    assert os.path.dirname(os.path.abspath(fl.__file__)) == os.path.join(os.path.abspath(code), "fastload")
    loaders: dict[str, object] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["do"] == "open":
            make = fl.transforms.train if cmd["train"] else fl.transforms.eval
            kind, backend = cmd["case"].split()
            if kind == "folder":
                ds = fl.ImageFolder(cmd["folder"], transform=make(224))
            else:
                ds = fl.WebDataset(cmd["shards"], transform=make(224))
            options = dict(batch_size=cmd["batch_size"], num_workers=cmd["workers"], normalize=False, device="cpu")
            options.update(backend=backend, shuffle=cmd["train"], seed=0, stall_warning=0)
            loaders[cmd["case"]] = loader = fl.Loader(ds, **options)
            for _ in loader:  # the warm-up epoch: workers start, samples get marked clean
                pass
            print(json.dumps({"ok": True}), flush=True)
        elif cmd["do"] == "epoch":
            loader = loaders[cmd["case"]]
            loader.set_epoch(cmd["epoch"])
            time.sleep(SETTLE)
            start, cpu, images, first = time.perf_counter(), cpu_seconds(), 0, None
            for k, (x, _) in enumerate(loader):
                if first is None:
                    first = time.perf_counter() - start
                images += x.shape[0]
                if cmd["limit"] and k + 1 >= cmd["limit"]:
                    break
            wall = time.perf_counter() - start
            time.sleep(SETTLE)  # workers started for a pass (persistent_workers=False) are joined, their time counted
            spent = cpu_seconds() - cpu
            rates = {"rate": images / wall, "cpu_rate": images / max(spent, 1e-3), "first_ms": 1000 * (first or 0)}
            print(json.dumps(rates), flush=True)
        elif cmd["do"] == "close":
            for loader in loaders.values():
                loader.close()
            loaders.clear()
            print(json.dumps({"ok": True}), flush=True)


# ---- the driver ------------------------------------------------------------------------------


class Version:
    """A child process running the fastload of checkout ``code``."""

    def __init__(self, name: str, code: str, roi: str | None = None) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": ""}  # the checkout alone decides which fastload runs
        if roi is not None:
            env["FASTLOAD_ROI"] = roi
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=code,
        )

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} version's process ended (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def shards_of(folder: str) -> str:
    """WebDataset shards of the photo folder (written once, beside it)."""
    from fastload.convert import convert

    dst = folder.rstrip("/") + "-wds"
    if not os.path.isdir(dst):
        convert(folder, dst, "wds", shard_samples=200, progress=False)
    return dst


def main() -> None:
    sys.path.insert(0, HERE)
    from common import loader_parser, median, photo_folder

    p = loader_parser(__doc__)
    p.set_defaults(batch_size=128)
    p.add_argument("--old", required=True, help="a checkout of the code before the redesign (git worktree)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--roi", default=None, help="FASTLOAD_ROI for both versions (e.g. trusted: region decodes)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="the cases to run (default: all)")
    args = p.parse_args()
    cases = tuple(args.cases)
    folder = photo_folder(args)
    shards = shards_of(folder)
    rounds, limit = (1, 3) if args.quick else (args.rounds, 0)
    bs = 16 if args.quick else args.batch_size
    new = os.path.dirname(HERE)
    results = {}
    for mode, train in (("train", True), ("eval", False)):
        versions = [Version("old", os.path.abspath(args.old), args.roi), Version("new", new, args.roi)]
        try:
            for v in versions:
                for case in cases:
                    v.ask(
                        do="open",
                        case=case,
                        train=train,
                        folder=folder,
                        shards=shards,
                        batch_size=bs,
                        workers=args.workers,
                    )
            runs: dict = {(v.name, case): [] for v in versions for case in cases}
            order = [(v, case) for case in cases for v in versions]
            for r in range(1, rounds + 1):
                for v, case in order if r % 2 else order[::-1]:
                    got = v.ask(do="epoch", case=case, epoch=r, limit=limit)
                    runs[(v.name, case)].append((got["rate"], got["cpu_rate"], got["first_ms"]))
            for v in versions:
                v.ask(do="close")
        finally:
            for v in versions:
                v.close()
        results[mode] = runs
        for k, unit in enumerate(("images/s (wall)", "images per CPU-second", "ms to an epoch's first batch")):
            print(f"{mode}, {unit}: median of {rounds} rounds")
            for case in cases:
                old = median([x[k] for x in runs[("old", case)]])
                now = median([x[k] for x in runs[("new", case)]])
                print(f"  {case:16s} old {old:7.0f}  new {now:7.0f}  new/old {now / old:5.2f}x")
    print(
        f"({bs} per batch, {args.workers} workers/threads, FASTLOAD_ROI={args.roi}, old code: "
        f"{os.path.abspath(args.old)})"
    )
    if args.json:
        with open(args.json, "a") as f:
            f.write(
                json.dumps(
                    {
                        "benchmark": "bench_old_new",
                        "quick": args.quick,
                        "roi": args.roi,
                        "runs": {m: {f"{v} {c}": x for (v, c), x in r.items()} for m, r in results.items()},
                    }
                )
                + "\n"
            )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
