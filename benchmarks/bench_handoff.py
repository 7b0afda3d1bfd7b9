"""Worker-to-main hand-off of a uint8 batch: new shared memory per batch (what the
process backend did before) against a slot the worker reuses, copied out on arrival
(fastload.sources.handoff).

Two DataLoader workers build batches of 128×224×224×3 (the pixels written once, as a
resize writes them) and the main process reads every batch once. The CPU time of the
whole process tree per batch is what the hand-off costs the pipeline; the rounds
alternate between the two ways.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from common import median, parser, report, tree_cpu_seconds
from torch.utils.data import DataLoader, get_worker_info

from fastload.batch import HostBatch
from fastload.collate import alloc_batch
from fastload.sources.handoff import BufferTable, detached
from fastload.sources.workers import worker_init


class Batches(torch.utils.data.Dataset):
    def __init__(self, count: int, shape: tuple[int, ...], slots: BufferTable | None) -> None:
        self.count, self.shape, self.slots = count, shape, slots

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> HostBatch:
        lease = None
        if self.slots is None:
            images = alloc_batch(self.shape)
        else:
            images, lease = self.slots.buffer(get_worker_info().id, self.shape)
        images.numpy().fill(i % 251)
        n = self.shape[0]
        return HostBatch(images, torch.zeros(n, dtype=torch.int64), torch.arange(n), 0, (), lease)


def epoch(loader: DataLoader) -> tuple[float, float]:
    """(wall ms, CPU ms of the process tree) per batch of one pass, each batch read once."""
    start, cpu, n, check = time.perf_counter(), tree_cpu_seconds(), 0, 0
    for batch in loader:
        batch = detached(batch)
        check += int(batch.images.numpy()[:, ::64, ::64].sum())  # the consumer reads its batch
        n += 1
    return (time.perf_counter() - start) / n * 1e3, (tree_cpu_seconds() - cpu) / n * 1e3


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    count, rounds = (8, 1) if args.quick else (100, 5)
    shape = (32, 224, 224, 3) if args.quick else (128, 224, 224, 3)
    loaders = {}
    for name, slots in (("new shared memory per batch", None), ("reused slot, copied out", BufferTable(2, 4))):
        loaders[name] = DataLoader(
            Batches(count, shape, slots),
            batch_size=None,
            num_workers=2,
            worker_init_fn=worker_init,
            persistent_workers=True,
            prefetch_factor=2,
        )
        epoch(loaders[name])  # warm-up: workers started
    runs: dict = {name: [] for name in loaders}
    for r in range(rounds):
        for name, loader in loaders.items() if r % 2 == 0 else reversed(loaders.items()):
            runs[name].append(epoch(loader))
    print(
        f"hand-off of a {'x'.join(map(str, shape))} uint8 batch ({np.prod(shape) / 1e6:.1f} MB), 2 workers, "
        f"median of {rounds} alternating rounds of {count} batches:"
    )
    med = {name: (median([r[0] for r in v]), median([r[1] for r in v])) for name, v in runs.items()}
    for name, (wall, cpu) in med.items():
        print(f"  {name:30s} {wall:7.2f} ms wall  {cpu:7.2f} ms CPU (all processes) per batch")
    old, new = med["new shared memory per batch"], med["reused slot, copied out"]
    # CPU time is counted in clock ticks (10 ms): a short run can read none for the reused slot.
    less = f"{old[1] / new[1]:.1f}x" if new[1] > 0 else "unmeasurably (under a clock tick)"
    print(
        f"reused slots: {less} less CPU per batch, {(old[1] - new[1]) / shape[0] * 1e3:.0f} µs of CPU saved per image"
    )
    report("bench_handoff", args, {"ms_per_batch": med, "rounds": runs, "shape": shape})


if __name__ == "__main__":
    main()
