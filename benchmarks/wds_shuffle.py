"""How close WebDataset's shard + window shuffle comes to a global shuffle (pure numpy: the
reading plan only, no image is read).

ImageNet-sized by default: 1,281,167 samples in 1,024 shards, 8 ranks × 8 workers, batch
256 per rank. The training order is what the ranks hand out step by step (DataLoader
takes a rank's batches from its workers in turn). Compared with a true permutation and
with webdataset's usual pipeline (shards shuffled, each worker reading its shards through
a 1,000-sample shuffle buffer). Measures:

* Spearman correlation of training position with storage position (a permutation: ~0);
* mean |training position - storage position| / N (a permutation: 1/3);
* correlation of each sample's position in two consecutive epochs (a permutation: ~0);
* distinct shards, and distinct classes when the shards hold the classes in order (an
  unshuffled conversion of a class-per-folder dataset: the worst case), per rank batch;
* the share of rank batches whose samples all come from at most ``window`` shards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastload.datasets.webdataset.slots import first_pass, fit, slot_sizes  # noqa: E402


def interleave(slot_orders: list[np.ndarray], world: int, workers: int, batch: int) -> np.ndarray:
    """The training order: step t hands out each rank's batch t (batch t of a rank is batch
    t // workers of its slot t % workers)."""
    steps = []
    per_slot = -(-len(slot_orders[0]) // batch)
    for t in range(per_slot * workers):
        for rank in range(world):
            slot = slot_orders[rank * workers + t % workers]
            steps.append(slot[(t // workers) * batch:(t // workers + 1) * batch])
    return np.concatenate(steps)


def window_order(counts: np.ndarray, world: int, workers: int, batch: int, window: int, epoch: int) -> np.ndarray:
    slots = world * workers
    length = slot_sizes(int(counts.sum()), slots, False)
    orders = [np.concatenate(fit(first_pass(counts, s, slots, epoch, 0, True, window), length, counts[:0]))
              for s in range(slots)]
    return interleave(orders, world, workers, batch)


def buffer_order(counts: np.ndarray, world: int, workers: int, batch: int, buffer: int, epoch: int) -> np.ndarray:
    """webdataset: shards shuffled, split over ranks then workers, read through a shuffle buffer."""
    rng = np.random.default_rng(epoch)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    shards = rng.permutation(len(counts))
    orders = []
    for rank in range(world):
        for worker in range(workers):
            mine = shards[rank::world][worker::workers]
            stream = np.concatenate([firsts[s] + np.arange(counts[s]) for s in mine])
            out, buf = np.empty(len(stream), np.int64), []
            k = 0
            for x in stream.tolist():
                buf.append(x)
                if len(buf) >= buffer:
                    j = int(rng.integers(len(buf)))
                    buf[j], buf[-1] = buf[-1], buf[j]
                    out[k] = buf.pop()
                    k += 1
            for j in rng.permutation(len(buf)):
                out[k] = buf[j]
                k += 1
            orders.append(out)
    length = min(len(o) for o in orders)  # webdataset has no equal-length guarantee: cut to compare
    return interleave([o[:length] for o in orders], world, workers, batch)


def measures(order: np.ndarray, next_order: np.ndarray, shard_of: np.ndarray, classes: np.ndarray, batch: int,
             window: int) -> dict:
    n = len(shard_of)
    first = np.full(n, -1, np.int64)
    seen = order[::-1]
    first[seen] = np.arange(len(order))[::-1][: len(seen)]  # a sample's first training position
    first_next = np.full(n, -1, np.int64)
    first_next[next_order[::-1]] = np.arange(len(next_order))[::-1]
    ok = (first >= 0) & (first_next >= 0)
    pos, storage = first[ok], np.flatnonzero(ok)
    rank = np.argsort(np.argsort(pos))
    batches = order[: len(order) // batch * batch].reshape(-1, batch)[:2000]
    shards = np.array([len(np.unique(shard_of[b])) for b in batches])
    return {"spearman_vs_storage": float(np.corrcoef(rank, storage)[0, 1]),
            "mean_displacement": float(np.mean(np.abs(rank / len(rank) - storage / n))),
            "epoch_to_epoch": float(np.corrcoef(first[ok], first_next[ok])[0, 1]),
            "shards_per_batch": float(shards.mean()),
            "classes_per_batch_sorted_storage": float(np.mean([len(np.unique(classes[b])) for b in batches])),
            "batches_within_window": float(np.mean(shards <= window))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1_281_167)
    p.add_argument("--shards", type=int, default=1024)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--windows", default="1,4,16")
    p.add_argument("--buffer", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="a small dataset, in a second")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.quick:
        args.samples, args.shards, args.classes, args.world, args.workers, args.batch = 40_000, 64, 100, 2, 4, 64
    counts = np.full(args.shards, args.samples // args.shards, np.int64)
    counts[: args.samples % args.shards] += 1
    shard_of = np.repeat(np.arange(args.shards), counts)
    classes = np.arange(args.samples) * args.classes // args.samples  # classes in storage order: the worst case
    rng = np.random.default_rng(0)
    rows = {"global permutation": measures(rng.permutation(args.samples), rng.permutation(args.samples), shard_of,
                                           classes, args.batch, 1)}
    for window in map(int, args.windows.split(",")):
        start = time.perf_counter()
        a = window_order(counts, args.world, args.workers, args.batch, window, 0)
        b = window_order(counts, args.world, args.workers, args.batch, window, 1)
        rows[f"fastload, window {window}"] = measures(a, b, shard_of, classes, args.batch, window)
        print(f"(window {window}: plan of two epochs in {time.perf_counter() - start:.1f} s)", file=sys.stderr)
    a = buffer_order(counts, args.world, args.workers, args.batch, args.buffer, 0)
    b = buffer_order(counts, args.world, args.workers, args.batch, args.buffer, 1)
    rows[f"webdataset, buffer {args.buffer}"] = measures(a, b, shard_of, classes, args.batch, 1)
    print(f"{args.samples} samples, {args.shards} shards, {args.world} ranks x {args.workers} workers, batch "
          f"{args.batch}; classes per batch with {args.classes} classes stored in order")
    keys = list(next(iter(rows.values())))
    print(f"{'':28s}" + "".join(f"{k:>18s}" for k in ("spearman", "|displacement|", "epoch-to-epoch",
                                                       "shards/batch", "classes/batch", "in window")))
    for name, row in rows.items():
        print(f"{name:28s}" + "".join(f"{row[k]:18.4f}" for k in keys))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"benchmark": "wds_shuffle", "quick": args.quick, "args": vars(args), "rows": rows})
                    + "\n")


if __name__ == "__main__":
    main()
