"""Copy-on-read (pytorch issue 13246): a million-sample index held as Python lists
against fastload's shared numpy storage. Two DataLoader workers touch every entry once;
per-worker USS growth and total PSS (main + workers) from /proc/PID/smaps_rollup,
under fork and under spawn."""

from __future__ import annotations

import gc

import numpy as np
import torch
from common import parser, report, smaps_rollup

from fastload.datasets.storage import SharedArray, StringArray


class ListIndex(torch.utils.data.Dataset):
    """What most datasets do: a list of (path, label) tuples."""

    def __init__(self, n: int) -> None:
        self.samples = [(f"train/n{i % 1000:08d}/img_{i:08d}.JPEG", i % 1000) for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def entry(self, i: int) -> int:
        path, label = self.samples[i]
        return len(path) + label


class FastloadIndex(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.paths = StringArray(f"train/n{i % 1000:08d}/img_{i:08d}.JPEG" for i in range(n))
        self.labels = SharedArray(np.arange(n) % 1000)

    def __len__(self) -> int:
        return len(self.labels)

    def entry(self, i: int) -> int:
        return len(self.paths.get_bytes(i)) + int(self.labels.array[i])


class Pass(torch.utils.data.IterableDataset):
    """Each worker reads its half of the index and reports its USS before and after."""

    def __init__(self, index) -> None:
        self.index = index

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        before = smaps_rollup()
        total = 0
        for i in range(info.id, len(self.index), info.num_workers):
            total += self.index.entry(i)
        after = smaps_rollup()
        yield {"pid": info.id, "uss_growth": after["uss"] - before["uss"], "pss": after["pss"], "sum": total}


def measure(cls, n: int, start: str) -> dict:
    index = cls(n)
    gc.collect()
    loader = torch.utils.data.DataLoader(Pass(index), num_workers=2, batch_size=None,
                                         multiprocessing_context=start)
    reports = list(loader)
    main_pss = smaps_rollup()["pss"]
    return {"per_worker_uss_growth_mb": [r["uss_growth"] / 1e6 for r in reports],
            "total_pss_mb": (main_pss + sum(r["pss"] for r in reports)) / 1e6}


def main() -> None:
    args = parser(__doc__).parse_args()
    n = 100_000 if args.quick else 1_000_000
    results = {}
    for start in ("fork", "spawn"):
        for name, cls in (("python lists", ListIndex), ("fastload storage", FastloadIndex)):
            r = results[f"{name} / {start}"] = measure(cls, n, start)
            growth = ", ".join(f"{g:.1f}" for g in r["per_worker_uss_growth_mb"])
            print(f"{start:5s} {name:17s} per-worker USS growth during the pass: {growth} MB; "
                  f"total PSS {r['total_pss_mb']:.0f} MB")
    print(f"({n:,} samples, 2 workers)")
    report("bench_memory", args, {"samples": n, "results": results})


if __name__ == "__main__":
    main()
