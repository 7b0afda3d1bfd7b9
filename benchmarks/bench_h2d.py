"""Host-to-device: the Loader's device stage per batch against a plain pinned ``copy_``.

The same bytes both ways: uint8 batches of 256 × 224×224×3 (38.5 MB) and their int64
labels. The Loader (``normalize=False``, so its device stage only copies; pinned batches
from 4 workers by default) reports in ``stats()["h2d_gbps"]`` the bytes of its image copies over
their time on its copy stream (CUDA events around each copy). The plain side: pinned
images and labels, copied with ``copy_(non_blocking=True)`` into device buffers, each
batch timed with CUDA events the same way. Target: the device stage >= 85% of the plain
copy. The Loader's batches must all arrive pinned (``stats()["unpinned_batches"]`` 0).

Why 4 workers: the dataset here does no work but copy ready frames, so its workers write
batches as fast as host memory takes them, beside the copy engine reading it. On the H100
machine (2026-11-26) the device stage reached 91% of the plain copy with 2 and 6 workers
and 46% and 83% with 14, where a lone pinned copy_ fell to 82% with 14 host threads
copying arrays beside it (h2d_contention.py): host memory bandwidth, not the stage. Workers
that decode JPEGs write a few hundred MB/s, not tens of GB/s; ``--workers 14`` shows the
contention.

--quick: the dry run on the CPU (small batches; "copies" timed by the host clock).
"""

from __future__ import annotations

import numpy as np
import torch
from common import report
from gpu_common import Clock, device_or_exit, gpu_parser, sync

import fastload as fl


class Frames(torch.utils.data.Dataset):
    """Ready H×W×3 uint8 images, no decode: the batch's bytes are all the host does."""

    def __init__(self, n: int, size: int) -> None:
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(16)]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.images[i % len(self.images)], i % 1000


def plain_copy_gbps(bs: int, size: int, batches: int, device: torch.device) -> float:
    """GB/s of pinned ``copy_`` of images and labels, per batch, timed like the device stage's."""
    pin = device.type == "cuda"
    g = torch.Generator().manual_seed(0)
    host = [(torch.randint(0, 256, (bs, size, size, 3), dtype=torch.uint8, generator=g),
             torch.arange(bs, dtype=torch.int64)) for _ in range(4)]
    if pin:
        host = [(x.pin_memory(), y.pin_memory()) for x, y in host]
    dst = (torch.empty(bs, size, size, 3, dtype=torch.uint8, device=device), torch.empty(bs, dtype=torch.int64,
                                                                                         device=device))
    clock, spans = Clock(device), []
    for i in range(batches + 2):
        x, y = host[i % len(host)]
        start = clock.mark()
        dst[0].copy_(x, non_blocking=True)
        dst[1].copy_(y, non_blocking=True)
        end = clock.mark()
        if i >= 2:  # the first two: warm-up
            spans.append((start, end))
    clock.settle()
    seconds = sum(clock.seconds(a, b) for a, b in spans)
    return len(spans) * host[0][0].numel() / seconds / 1e9


def main() -> None:
    p = gpu_parser(__doc__.splitlines()[0], workers=4)
    p.add_argument("--batches", type=int, default=40, help="batches each way (default: 40)")
    args = p.parse_args()
    device = device_or_exit(args, "bench_h2d")
    bs, size, workers, n = (8, 64, 2, 6) if args.quick else (256, 224, args.workers, args.batches)
    plain = plain_copy_gbps(bs, size, n, device)
    with fl.Loader(Frames(bs * (n + 2), size), batch_size=bs, num_workers=workers, device=device, normalize=False,
                   drop_last=True) as loader:
        batches = 0
        for _ in loader:
            batches += 1
        sync(device)
        stats = loader.stats()
    stage = stats["h2d_gbps"]
    share = stage / plain if stage else None  # None: no CUDA events on the CPU
    mb = bs * size * size * 3 / 1e6
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "the CPU (dry run: no copy events)"
    print(f"H2D of {mb:.1f} MB uint8 batches + labels on {where}: plain pinned copy_ {plain:.1f} GB/s; Loader "
          f"device stage {stage or float('nan'):.1f} GB/s ({share or float('nan'):.0%} of plain; target >= 85%); "
          f"{batches} batches, {stats['unpinned_batches']} unpinned")
    report("bench_h2d", args, {"plain_gbps": plain, "stage_gbps": stage, "stage_share": share, "batches": batches,
                               "unpinned_batches": stats["unpinned_batches"], "batch_mb": mb})
    if stats["unpinned_batches"]:
        raise SystemExit(f"bench_h2d: {stats['unpinned_batches']} of {batches} batches arrived unpinned")


if __name__ == "__main__":
    main()
