"""WebDataset shards on the photo set: fastload from a local HTTP server against the same shards
from local disk, and against the webdataset package's own pipeline, in one interleaved run.

The photo set (fastload.photos.jpegs) is written as WebDataset shards by fastload's converter;
an ``http.server`` process serves them on 127.0.0.1. Every pipeline runs train
transforms (RandomResizedCrop 224 with an antialiased resize, horizontal flip) into uint8
batches, with the same workers and batch size, shuffled:

* fastload, disk: ``fl.WebDataset(<local shards>)`` under ``fl.Loader(shuffle=True)``.
* fastload, HTTP: the same from the server, with an empty shard cache each round (every
  shard downloads during the timed epoch; the indexes were built beforehand).
* webdataset, disk / HTTP: ``wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=...)
  .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(<timm's train transform>)
  .batched(bs, collation_fn=<timm's fast_collate>)`` in ``wds.WebLoader`` workers
  (batching in the workers, its recommended setup; HTTP through its curl pipe).

Rounds run each pipeline for one epoch in turn. Reported: each pipeline's median rate with
its range, and each ratio as the median of the per-round ratios (the pipelines of a round
run back to back, so a ratio within a round is what load from other jobs on a shared
machine disturbs least).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from common import loader_parser, median, photo_folder, photo_set_record, report
from peers import hflip, pil_to_tensor, resized_crop, timm_fast_collate, timm_rrc_params

import fastload as fl
from fastload.convert import convert


def epoch_rate(batches) -> float:
    start, images = time.perf_counter(), 0
    for x, _ in batches:
        images += x.shape[0]
    return images / (time.perf_counter() - start)


def shard_set(root: str, data: str, per_shard: int) -> str:
    """The photo set as WebDataset shards (written once, kept beside the photos)."""
    dst = os.path.join(data, f"{os.path.basename(root)}-wds{per_shard}")
    if not os.path.isdir(dst):
        convert(root, dst, "wds", shard_samples=per_shard, progress=False)
    return dst


def serve(folder: str) -> tuple[subprocess.Popen, str]:
    """``python -m http.server`` on 127.0.0.1 over ``folder``, in its own process (no GIL shared)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                             folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/", timeout=1).close()
            return proc, base
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the HTTP server did not start")


def timm_train(img, size: int = 224):
    return pil_to_tensor(hflip(resized_crop(img.convert("RGB"), *timm_rrc_params(*img.size), size)))


def wds_loader(urls: list[str], bs: int, workers: int):
    import webdataset as wds

    pipe = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker,
                           empty_check=False)
            .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(timm_train, int)
            .batched(bs, collation_fn=timm_fast_collate, partial=True))
    return wds.WebLoader(pipe, batch_size=None, num_workers=workers, persistent_workers=False)


def main() -> None:
    p = loader_parser(__doc__, epochs=3)
    p.add_argument("--per-shard", type=int, default=125, help="samples per shard")
    args = p.parse_args()
    rounds = 1 if args.quick else args.epochs
    per_shard = 12 if args.quick else args.per_shard
    root = photo_folder(args)
    shards = shard_set(root, args.data, per_shard)
    names = sorted(f for f in os.listdir(shards) if f.endswith(".tar"))
    size_mb = sum(os.path.getsize(os.path.join(shards, f)) for f in names) / 1e6
    print(f"{len(names)} shards of {per_shard} photos, {size_mb:.0f} MB; {args.workers} workers, batch {args.batch_size}"
          f", {rounds} interleaved round(s)")
    tmp = tempfile.mkdtemp(prefix="bench-wds-")
    server, base = serve(shards)
    try:
        local = [os.path.join(shards, f) for f in names]
        remote = [f"{base}/{f}" for f in names]
        index_dir = os.path.join(tmp, "index")
        transform = fl.transforms.train(224)
        disk_ds = fl.WebDataset(local, transform, index_dir=index_dir)
        fl.WebDataset(remote, index_dir=index_dir, cache=False)  # indexes built before any timing
        opts = dict(batch_size=args.batch_size, num_workers=args.workers, shuffle=True, device="cpu", normalize=False)
        rates: dict[str, list[float]] = {}

        def fastload_http(k: int):
            cache = os.path.join(tmp, f"cache{k}")  # cold: every shard downloads in the epoch
            ds = fl.WebDataset(remote, transform, index_dir=index_dir, cache_dir=cache)
            return fl.Loader(ds, **opts)

        pipelines = {
            "fastload, disk": lambda k: fl.Loader(disk_ds, **opts),
            "fastload, HTTP (cold cache)": fastload_http,
            "webdataset, disk": lambda k: wds_loader(local, args.batch_size, args.workers),
            "webdataset, HTTP": lambda k: wds_loader(remote, args.batch_size, args.workers),
        }
        for k in range(rounds):
            for name, make in pipelines.items():
                loader = make(k)
                try:
                    rates.setdefault(name, []).append(epoch_rate(loader))
                finally:
                    if hasattr(loader, "close"):
                        loader.close()
                if name.startswith("fastload, HTTP"):
                    shutil.rmtree(os.path.join(tmp, f"cache{k}"), ignore_errors=True)
        med = {name: median(r) for name, r in rates.items()}
        for name, r in rates.items():
            print(f"{name:30s} {med[name]:8.0f} images/s  (range {min(r):.0f}-{max(r):.0f})")

        def ratio(a: str, b: str) -> tuple[float, list[float]]:
            per_round = [x / y for x, y in zip(rates[a], rates[b])]
            return median(per_round), per_round

        http_vs_disk, r1 = ratio("fastload, HTTP (cold cache)", "fastload, disk")
        vs_wds, r2 = ratio("fastload, HTTP (cold cache)", "webdataset, HTTP")
        vs_wds_disk, r3 = ratio("fastload, disk", "webdataset, disk")
        show = lambda r: ", ".join(f"{x:.2f}" for x in r)  # noqa: E731
        print(f"fastload HTTP / fastload disk: {http_vs_disk:.2f} (target >= 0.90; rounds: {show(r1)})")
        print(f"fastload HTTP / webdataset HTTP: {vs_wds:.2f}x (target >= 1.5x; rounds: {show(r2)})")
        print(f"fastload disk / webdataset disk: {vs_wds_disk:.2f}x (rounds: {show(r3)})")
        report("bench_wds", args, {"photos": photo_set_record(root), "shards": len(names), "per_shard": per_shard,
                                   "megabytes": size_mb, "workers": args.workers, "batch_size": args.batch_size,
                                   "rounds": rounds, "images_per_s": med, "ranges": rates,
                                   "http_vs_disk": http_vs_disk, "http_vs_webdataset": vs_wds,
                                   "disk_vs_webdataset_disk": vs_wds_disk,
                                   "per_round_ratios": {"http_vs_disk": r1, "http_vs_webdataset": r2,
                                                        "disk_vs_webdataset_disk": r3}})
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
