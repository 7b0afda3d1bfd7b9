"""Thread backend against the process backend: training pipeline, same worker count,
same images, in one run; and the host bytes written per batch by the thread backend."""

from __future__ import annotations


import torch
from common import loader_parser, loader_rate, report, photo_folder

import fastload as fl


def measure(ds, backend: str, bs: int, workers: int, epochs: int, device: str) -> tuple[float, fl.Loader]:
    loader = fl.Loader(ds, batch_size=bs, num_workers=workers, shuffle=True, backend=backend, device=device)
    return loader_rate(loader, epochs), loader


def main() -> None:
    p = loader_parser(__doc__)
    args = p.parse_args()
    ds = fl.ImageFolder(photo_folder(args), transform=fl.transforms.train(224))
    bs, workers, epochs = (8, 2, 1) if args.quick else (args.batch_size, args.workers, args.epochs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rates = {}
    for backend in ("process", "thread"):
        rates[backend], loader = measure(ds, backend, bs, workers, epochs, device)
        if backend == "thread":
            copies = loader._source.copies
        loader.close()
    ratio = rates["thread"] / rates["process"]
    print(f"train 224, batch {bs}, {workers} workers, device {device}: process {rates['process']:.0f} images/s | "
          f"thread {rates['thread']:.0f} images/s ({ratio:.2f}x)")
    print(f"thread backend: samples decoded beside their batch row and copied in: {copies} "
          "(the first, which sizes the buffer ring, and nothing else)")
    report("bench_threads", args, {"images_per_s": rates, "ratio": ratio, "extra_copies": copies})


if __name__ == "__main__":
    main()
