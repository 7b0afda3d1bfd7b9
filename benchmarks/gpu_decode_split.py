"""Where a ``decode="gpu"`` batch's time goes: nvImageCodec's call against the rest of the stage.

A diagnostic for bench_gpu_decode: one loader (RandomResizedCrop(224) + flip, batch 256,
--workers workers) over the photo set; the driver thread's two parts are timed per batch
with the device synchronized around each (so the split is exact and the total a little
slower than bench_gpu_decode's): ``BatchDecoder.decode`` (nvImageCodec: encoded bytes to
decoded images on the GPU) and the rest of ``GpuDecode._decode`` (per-row cut and
antialiased resize, flips, rounding). Prints ms per batch of each, the images/s of the
loop, and how many batches asked for regions and how many for whole images.
"""

from __future__ import annotations

import time

import torch
from gpu_common import gpu_parser, photos, repeat

import fastload as fl
from fastload.device.gpudecode import executor, nvdecode


def timed(spent: list[float], fn):  # noqa: ANN001, ANN201 (a wrapper of either signature)
    def wrapper(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*a, **kw)
        torch.cuda.synchronize()
        spent.append(time.perf_counter() - start)
        return out

    return wrapper


def main() -> None:
    p = gpu_parser(__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=40)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_decode_split needs a CUDA GPU")
    root, paths, labels = photos(args)
    n = (args.batches + 4 * args.workers) * 256
    ds = fl.ImageList.from_arrays(repeat(paths, n), repeat(labels, n), root, transform=fl.transforms.train(224))
    decode_s: list[float] = []
    stage_s: list[float] = []
    nvdecode.BatchDecoder.decode = timed(decode_s, nvdecode.BatchDecoder.decode)
    executor.GpuDecode._decode = timed(stage_s, executor.GpuDecode._decode)
    with fl.Loader(ds, batch_size=256, num_workers=args.workers, decode="gpu", device="cuda", drop_last=True) as loader:
        batches = iter(loader)
        for _ in range(2 * args.workers):
            next(batches)
        torch.cuda.synchronize()
        skip_d, skip_s = len(decode_s), len(stage_s)
        start = time.perf_counter()
        for _ in range(args.batches):
            next(batches)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        fallbacks = loader.stats()["cpu_fallback_rows"]
    d, s = decode_s[skip_d:], stage_s[skip_s:]
    ms = 1e3 / max(len(s), 1)
    print(f"decode='gpu', {args.workers} workers, {args.batches} batches of 256: {args.batches * 256 / wall:.0f} "
          f"images/s (synchronized); per batch: nvImageCodec {sum(d) * ms:.1f} ms, the whole stage "
          f"{sum(s) * ms:.1f} ms (cut/resize/flip {(sum(s) - sum(d)) * ms:.1f} ms), "
          f"wall {wall * 1e3 / args.batches:.1f} ms; CPU fall-back rows {fallbacks}")


if __name__ == "__main__":
    main()
