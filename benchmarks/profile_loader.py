"""Keeps the training loader busy for a while, for a sampling profiler, and sums a
py-spy raw profile by innermost frame.

    py-spy record --subprocesses --format raw -o spy.txt --duration 10 -- \\
        python benchmarks/profile_loader.py --seconds 12
    python benchmarks/profile_loader.py --aggregate spy.txt
"""

from __future__ import annotations

import collections
import time

from common import parser, report, sample_folder

import fastload as fl
from fastload.system import available_cpus


def aggregate(path: str, top: int = 15) -> dict:
    leaves: collections.Counter = collections.Counter()
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        leaves[stack.split(";")[-1].split(" (")[0]] += int(count)
    total = sum(leaves.values())
    shares = {k: v / total for k, v in leaves.most_common(top)}
    for name, share in shares.items():
        print(f"{share:6.1%}  {name}")
    return shares


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--seconds", type=float, default=12)
    p.add_argument("--backend", default="process")
    p.add_argument("--aggregate", default=None, metavar="SPY.txt", help="sum a py-spy raw profile and exit")
    args = p.parse_args()
    if args.aggregate:
        report("profile_loader", args, {"leaf_shares": aggregate(args.aggregate)})
        return
    ds = fl.ImageFolder(sample_folder(args), transform=fl.transforms.train(224))
    seconds = 1 if args.quick else args.seconds
    images, start, epoch = 0, time.perf_counter(), 0
    with fl.Loader(ds, batch_size=64, num_workers=available_cpus(), shuffle=True, device="cpu",
                   backend=args.backend) as loader:
        while time.perf_counter() - start < seconds:
            loader.set_epoch(epoch)
            epoch += 1
            images += sum(y.shape[0] for _, y in loader)
    print(f"ran the training loader for {time.perf_counter() - start:.1f} s: {images} images")
    report("profile_loader", args, {"images": images})


if __name__ == "__main__":
    main()
