"""Why a device stage's copy can be slower than a lone ``copy_``: host memory traffic beside it.

bench_h2d times the Loader's copies while its workers write the next batches (and torch's
pin-memory thread copies each into pinned memory), so the copy engine shares host memory
bandwidth with them; its plain side copies with nothing else running. This diagnostic
times the same pinned ``copy_`` of a 38.5 MB uint8 batch (CUDA events) alone, then while
``--threads`` host threads copy 38.5 MB numpy arrays in a loop (numpy releases the GIL),
and prints each rate and its share of the lone one. A share well under 1 with threads
running means bench_h2d's gap is host bandwidth, not the device stage.
"""

from __future__ import annotations

import argparse
import threading

import numpy as np
import torch


def copy_gbps(batches: int = 30) -> float:
    host = torch.randint(0, 256, (256, 224, 224, 3), dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(host, device="cuda")
    spans = []
    for i in range(batches + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(host, non_blocking=True)
        end.record()
        if i >= 2:
            spans.append((start, end))
    torch.cuda.synchronize()
    return len(spans) * host.numel() / sum(a.elapsed_time(b) / 1e3 for a, b in spans) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[2, 8, 14])
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("h2d_contention needs a CUDA GPU")
    alone = copy_gbps()
    print(f"pinned copy_ of 38.5 MB alone: {alone:.1f} GB/s")
    for n in args.threads:
        stop = threading.Event()

        def churn(stop: threading.Event = stop) -> None:
            src, dst = np.ones(38_535_168, np.uint8), np.empty(38_535_168, np.uint8)
            while not stop.is_set():
                np.copyto(dst, src)

        threads = [threading.Thread(target=churn, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        try:
            busy = copy_gbps()
        finally:
            stop.set()
            for t in threads:
                t.join()
        print(f"  with {n:2d} host threads copying 38.5 MB arrays: {busy:.1f} GB/s ({busy / alone:.0%} of alone)")


if __name__ == "__main__":
    main()
