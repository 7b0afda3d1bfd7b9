"""Host-to-device transfer and overlap of the CUDA prefetcher (issue: CUDA-stream prefetcher).

1. Achieved H2D GB/s of CudaPrefetcher against a plain pinned ``copy_`` of the same bytes.
2. Overlap: with a GPU step longer than the copy, step time with the prefetcher against
   the step alone (copy hidden) and against copy-then-step without it.
3. Peer: timm's PrefetchLoader at equal settings, when timm is installed.

Without CUDA, --quick runs the same code on the CPU path so it cannot rot; a full run
says it needs a GPU and exits.
"""

from __future__ import annotations

import time

import torch
from common import parser, report

from fastload.config import IMAGENET_MEAN, IMAGENET_STD
from fastload.prefetch import CudaPrefetcher, Normalizer


def batches(n: int, shape: tuple, pin: bool) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
        out.append((x.pin_memory() if pin else x, torch.zeros(shape[0], dtype=torch.int64)))
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(device: torch.device, target_s: float):
    """A GPU step (matmuls) calibrated to take about ``target_s``."""
    size = 4096 if device.type == "cuda" else 256
    a = torch.randn(size, size, device=device)
    reps = 1

    def step(x: torch.Tensor) -> None:
        y = a
        for _ in range(reps):
            y = y @ a
        x.float().sum()  # consume the batch

    while True:
        sync(device)
        start = time.perf_counter()
        step(torch.zeros(1, device=device))
        sync(device)
        took = time.perf_counter() - start
        if took >= target_s or reps > 10_000:
            return step, took
        reps = max(reps + 1, int(reps * target_s / max(took, 1e-6)))


def timed_loop(it, step, device) -> float:
    sync(device)
    start = time.perf_counter()
    n = 0
    for x, _ in it:
        step(x)
        n += 1
    sync(device)
    return (time.perf_counter() - start) / n


def main() -> None:
    args = parser(__doc__).parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print("bench_h2d needs a CUDA GPU (run benchmarks/gpu_suite.sh on one); --quick checks the CPU path")
        return
    device = torch.device("cuda" if cuda else "cpu")
    n, shape = (4, (8, 64, 64, 3)) if args.quick else (40, (256, 224, 224, 3))
    src = batches(n if args.quick else 8, shape, pin=cuda)
    stream = [src[i % len(src)] for i in range(n)]
    nbytes = src[0][0].numel()

    # 1. Plain pinned copy_ of the same bytes, back to back.
    dst = torch.empty(shape, dtype=torch.uint8, device=device)
    sync(device)
    start = time.perf_counter()
    for x, _ in stream:
        dst.copy_(x, non_blocking=True)
    sync(device)
    plain_gbps = n * nbytes / (time.perf_counter() - start) / 1e9

    # The prefetcher moving the same batches (uint8 out, so only the copy is measured).
    p = CudaPrefetcher(stream, device=device, depth=2, normalizer=Normalizer(normalize=False))
    sync(device)
    start = time.perf_counter()
    for _ in p:
        pass
    sync(device)
    wall_gbps = n * nbytes / (time.perf_counter() - start) / 1e9
    event_gbps = p.stats.as_dict()["h2d_gbps"]
    print(f"H2D {nbytes / 1e6:.1f} MB batches on {torch.cuda.get_device_name(0) if cuda else 'cpu'}: plain pinned "
          f"copy_ {plain_gbps:.1f} GB/s; prefetcher {wall_gbps:.1f} GB/s wall"
          + (f", {event_gbps:.1f} GB/s per copy (events)" if event_gbps else "")
          + f" = {wall_gbps / plain_gbps:.0%} of plain")

    # 2. Overlap with a step about twice as long as one copy.
    copy_s = nbytes / (plain_gbps * 1e9)
    step, step_s = make_step(device, 2 * copy_s)
    norm = Normalizer(IMAGENET_MEAN, IMAGENET_STD)
    resident = [(norm(x.to(device)), y) for x, y in stream[:1]] * n
    alone = timed_loop(iter(resident), step, device)
    with_prefetch = timed_loop(iter(CudaPrefetcher(stream, device=device, depth=2)), step, device)
    without = timed_loop(((norm(x.to(device)), y.to(device)) for x, y in stream), step, device)
    print(f"step alone {1e3 * alone:.2f} ms | with prefetcher {1e3 * with_prefetch:.2f} ms "
          f"({with_prefetch / alone - 1:+.1%}) | copy then step {1e3 * without:.2f} ms ({without / alone - 1:+.1%})")
    result = {"plain_gbps": plain_gbps, "prefetcher_gbps": wall_gbps, "prefetcher_event_gbps": event_gbps,
              "step_ms": {"alone": 1e3 * alone, "prefetcher": 1e3 * with_prefetch, "no_prefetcher": 1e3 * without}}

    # 3. timm's PrefetchLoader at equal settings.
    try:
        from timm.data.loader import PrefetchLoader
    except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision without its compiled ops
        print(f"timm does not import here ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
              "PrefetchLoader peer skipped")
    else:
        if cuda:
            nchw = [(x.permute(0, 3, 1, 2), y) for x, y in stream]
            timm_loader = PrefetchLoader(nchw, mean=IMAGENET_MEAN, std=IMAGENET_STD, channels=3, device=device)
            timm_step = timed_loop(iter(timm_loader), step, device)
            result["step_ms"]["timm_prefetchloader"] = 1e3 * timm_step
            print(f"timm PrefetchLoader {1e3 * timm_step:.2f} ms ({timm_step / alone - 1:+.1%} over the step alone); "
                  f"fastload/timm step time {with_prefetch / timm_step:.2f}")
    report("bench_h2d", args, result)


if __name__ == "__main__":
    main()
