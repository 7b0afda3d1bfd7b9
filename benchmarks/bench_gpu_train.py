"""The training feed: a ResNet step fed by fastload, by DataLoader at its best and by timm's
create_loader, against the model alone on a fixed GPU batch (the ceiling).

torchvision ResNet-18 and ResNet-50 (random init), bf16 autocast, channels_last, SGD,
batch 256, the same RandomResizedCrop(224) + flip for every loader:

- fastload, in each decode mode of --modes (gpu_common.MODES): "cpu" (the default, label
  "fastload"), "gpu" ("fastload gpu"), "gpu+cpu" ("fastload gpu+cpu": both decoders at once,
  skipped where the Loader lacks gpu_common.GPU_SHARE_OPTION): normalized float32
  channels_last batches on the GPU; the device stage's own h2d_gbps recorded for each run.
- DataLoader at its best: file bytes -> ``torchvision.io.decode_jpeg`` -> v2
  RandomResizedCrop (antialiased, on the uint8 tensor) + flip in the workers, uint8 batches
  (a uint8 collate), pin_memory, persistent_workers; then SideStreamPrefetcher, the pattern
  of NVIDIA apex's ImageNet example and timm's PrefetchLoader written here: the next batch
  copied, normalized and made channels_last on a side stream while the model runs, the
  training stream waiting on its event, record_stream on the tensors handed over. Its
  workers and prefetch_factor are swept first on ResNet-18 (--dl-workers x --dl-prefetch:
  every worker count at the first prefetch_factor, then every prefetch_factor at the best
  count; --dl-sweep grid: every pair), each point logged, the best kept for the timed runs.
- timm: ``create_loader(use_prefetcher=True)``: uint8 fast_collate, its PrefetchLoader;
  timm.__version__ in the record.
- model alone: one normalized batch resident on the GPU, every step.

ResNet-18: --repeats repeats (3) of every feed, interleaved A B C ... then ... C B A, then
A B C ...: each run a fresh loader, --warmup untimed steps (2 per worker), then --steps
timed ones (100). Per feed: min / median / max images/s over the repeats; the ratio of
fastload's best mode (highest median) to the better peer of the same repeat, and to the
model alone of the same repeat, per repeat (min and max). ResNet-50: --r50-repeats (1) of
fastload's best mode (--r50-modes: gpu+cpu where the Loader takes the share option, else
cpu) with --r50-workers (4): the data wait with few workers. GPU clocks,
temperature and throttle reasons are read before and after every repeat.

A repeat is started only while the time left (--time-limit, from gpu_check) holds the last
repeat's duration; ResNet-50 only while it holds --r50-needs seconds a run: what is left out
is said and recorded, never cut off half-way. Every run's record holds its phases (make,
warm-up, timed, close: host seconds) for the next plan (GPU.md).

An epoch is longer than a run (the photo list repeated), so no run crosses an epoch end.

How a step is timed, the same for every loader (CUDA events on the training stream, no
synchronize inside the timed loop):
    batch = next(loader); batch.to(device, non_blocking=True)      # host: the loader's part
    event A recorded                                                # data ready on the GPU
    forward, backward, optimizer step
    event B recorded
Step i lasts B[i-1] -> B[i] on the GPU; the GPU waited for data B[i-1] -> A[i]: zero when the
host had queued the batch (its copy, its normalization, its stream wait) before the GPU
finished the previous step. Host time blocked in next() is reported besides.

--quick: the dry run on the CPU (ResNet-18 and ResNet-50 at 32 px, batch 4, 2 workers, 2
repeats of 2 steps, a 3-point sweep, perf_counter marks instead of events), every feed.
"""

from __future__ import annotations

import inspect
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import gpu_trace
import torch
import torch.nn as nn
from common import machine, report
from gpu_common import (
    Clock,
    device_or_exit,
    feeding,
    gpu_clocks,
    gpu_parser,
    import_peers,
    interleaved,
    jpeg_decoder,
    mode_options,
    modes_list,
    per_repeat_ratios,
    photos,
    read_bytes,
    repeat,
    seconds_left,
    share_value,
    spread,
)

import fastload as fl
from fastload.config import IMAGENET_MEAN, IMAGENET_STD

PEERS = ("DataLoader best", "timm create_loader")
ALONE = "model alone"


def label_of(mode: str) -> str:
    """The feed's label of a fastload decode mode ("fastload": the default, as before)."""
    return "fastload" if mode == "cpu" else f"fastload {mode}"


def make_model(name: str, device: torch.device) -> nn.Module:
    import torchvision.models

    return getattr(torchvision.models, name)().to(device).to(memory_format=torch.channels_last)


def run_steps(batches: Iterator, net: nn.Module, device: torch.device, warmup: int, steps: int) -> dict:
    """``warmup`` untimed steps, then ``steps`` timed ones; see the module doc for the timing."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    clock = Clock(device)
    ready, done, host_wait, images = [], [], 0.0, 0
    began = timed_from = time.perf_counter()
    for i in range(warmup + steps):
        if i == warmup:
            timed_from = time.perf_counter()
        asked = time.perf_counter()
        x, y = next(batches)[:2]
        x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        if i >= warmup:
            host_wait += time.perf_counter() - asked
            images += x.shape[0]
            ready.append(clock.mark())
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = net(x)
            loss = loss_fn(out, y % out.shape[1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup - 1:
            done.append(clock.mark())  # done[0]: the end of the last warm-up step
    clock.settle()
    ended = time.perf_counter()
    step = [clock.seconds(done[k], done[k + 1]) for k in range(steps)]
    wait = [clock.seconds(done[k], ready[k]) for k in range(steps)]
    total = sum(step)
    return {"images_per_s": images / total, "wait_share": sum(wait) / total, "step_ms": 1e3 * statistics.median(step),
            "wait_ms": 1e3 * statistics.median(wait), "host_wait_share": host_wait / total, "steps": steps,
            "warmup_s": timed_from - began, "timed_s": ended - timed_from}


class DecodeJpegDataset(torch.utils.data.Dataset):
    """A DataLoader user's dataset at its best: bytes -> decode_jpeg -> v2 crop + flip, uint8 CxHxW."""

    def __init__(self, root: str, paths: list[str], labels: list[int], size: int, decode: Callable) -> None:
        from torchvision.transforms import v2

        self.root, self.paths, self.labels, self.decode = root, paths, labels, decode
        self.transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = self.decode(read_bytes(os.path.join(self.root, self.paths[i])))
        return self.transform(image), self.labels[i]


def uint8_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """apex's fast_collate for tensors: one uint8 NxCxHxW batch (a quarter of float32's bytes
    to pin and copy) and int64 labels."""
    images = torch.empty((len(batch), *batch[0][0].shape), dtype=torch.uint8)
    for i, (image, _) in enumerate(batch):
        images[i].copy_(image)
    return images, torch.tensor([label for _, label in batch], dtype=torch.int64)


class SideStreamPrefetcher:
    """The CUDA prefetcher of NVIDIA apex's ImageNet example and timm's PrefetchLoader, our
    own code: while the model runs on batch i, batch i+1 is copied (non_blocking, from pinned
    memory), normalized (float32) and made channels_last on a side stream, an event recorded
    after it. Handing a batch over, the consumer's stream waits on its event (no host sync)
    and the tensors are ``record_stream``-ed on it, so the allocator does not give their
    memory to the side stream's next batch while the model still reads them. On the CPU (the
    dry run) the same operations run inline."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device
        self.mean = 255 * torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
        self.std = 255 * torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)

    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
        return x.contiguous(memory_format=torch.channels_last), y.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.device.type != "cuda":
            for x, y in self.loader:
                yield self.prepare(x, y)
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))  # mean and std were made on the current one
        batches = iter(self.loader)

        def queue() -> tuple | None:
            try:
                x, y = next(batches)
            except StopIteration:
                return None
            ready = torch.cuda.Event()
            with torch.cuda.stream(stream):
                x, y = self.prepare(x, y)
                ready.record(stream)
            return x, y, ready

        pending = queue()
        while pending is not None:
            x, y, ready = pending
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(ready)
            x.record_stream(consumer)
            y.record_stream(consumer)
            pending = queue()  # the next batch queued on the side stream before this one is used
            yield x, y


class Feeds:
    """Makers of each fed run's batches, on one photo set and its long epoch."""

    def __init__(self, args: Any, device: torch.device, bs: int, size: int, epoch: int) -> None:
        self.args, self.device, self.bs, self.size = args, device, bs, size
        self.root, paths, labels = photos(args)
        self.paths, self.labels = repeat(paths, epoch), repeat(labels, epoch)
        self.torchvision, self.timm = import_peers(args.quick)
        self.decode = jpeg_decoder(self.torchvision, args.quick, os.path.join(self.root, paths[0]))
        self.share = share_value(args.gpu_share)
        self.dl_workers, self.dl_prefetch = None, None  # the sweep's choice

    def fastload(self, mode: str, workers: int) -> Any:
        ds = fl.ImageList.from_arrays(self.paths, self.labels, self.root, transform=fl.transforms.train(self.size))
        return fl.Loader(ds, batch_size=self.bs, shuffle=True, drop_last=True, num_workers=workers,
                         device=self.device, seed=0, **mode_options(mode, self.share))

    def dataloader(self, workers: int, prefetch: int) -> Any:
        ds = DecodeJpegDataset(self.root, self.paths, self.labels, self.size, self.decode)
        return torch.utils.data.DataLoader(ds, batch_size=self.bs, shuffle=True, drop_last=True,
                                           num_workers=workers, prefetch_factor=prefetch, collate_fn=uint8_collate,
                                           pin_memory=self.device.type == "cuda", persistent_workers=True)

    def timm_loader(self, workers: int) -> Any:
        """create_loader with its prefetcher, augmentation cut to crop + flip (no colour jitter)."""
        ds = self.timm.data.ImageDataset(self.root)
        ds.reader.samples = repeat(ds.reader.samples, len(self.paths))
        options = dict(input_size=(3, self.size, self.size), batch_size=self.bs, is_training=True, use_prefetcher=True,
                       scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, color_jitter=0.0, re_prob=0.0,
                       interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD, num_workers=workers,
                       pin_memory=self.device.type == "cuda", persistent_workers=True, device=self.device)
        accepted = inspect.signature(self.timm.data.create_loader).parameters
        return self.timm.data.create_loader(ds, **{k: v for k, v in options.items() if k in accepted})

    def make(self, label: str, workers: int, prefetch: int | None = None) -> tuple[Any, Iterator]:
        """(loader or None, its batches) of the feed ``label``."""
        if label.startswith("fastload"):
            mode = "cpu" if label == "fastload" else label.split(" ", 1)[1]
            loader = self.fastload(mode, workers)
            return loader, iter(loader)
        if label == "DataLoader best":
            loader = self.dataloader(workers, prefetch or self.dl_prefetch or 2)
            return loader, iter(SideStreamPrefetcher(loader, self.device))
        if label == "timm create_loader":
            loader = self.timm_loader(workers)
            return loader, iter(loader)
        if label == ALONE:
            g = torch.Generator().manual_seed(0)
            x = torch.randn(self.bs, 3, self.size, self.size, generator=g).to(self.device)
            y = torch.randint(0, 1000, (self.bs,), generator=g).to(self.device)
            return None, itertools.repeat((x.contiguous(memory_format=torch.channels_last), y))
        raise ValueError(label)


def timed_run(feeds: Feeds, label: str, workers: int, net: nn.Module, warmup: int, steps: int,
              prefetch: int | None = None) -> dict:
    """One run of a fresh feed: its figures, the device stage's h2d_gbps (fastload), and its
    phases in host seconds (make: the loader made; warm-up; timed; close)."""
    began = time.perf_counter()
    loader, batches = feeds.make(label, workers, prefetch)
    made = time.perf_counter()
    with feeding(loader, batches) as fed:
        result = run_steps(fed, net, feeds.device, warmup, steps)
        if isinstance(loader, fl.Loader):
            result["h2d_gbps"] = loader.stats()["h2d_gbps"]
        closing = time.perf_counter()
        del loader
    ended = time.perf_counter()
    return {**result, "workers": workers, "make_s": made - began, "close_s": ended - closing, "run_s": ended - began}


def sweep_dataloader(feeds: Feeds, net: nn.Module, s: dict) -> None:
    """The DataLoader's workers and prefetch_factor swept on the model (short runs: 1 warm-up
    step per worker, s["sweep_steps"] timed); every point reported; the best kept in feeds."""
    workers, prefetch = s["dl_workers"], s["dl_prefetch"]
    if s["dl_sweep"] == "grid":
        plan = [(w, p) for w in workers for p in prefetch]
    else:
        plan = [(w, prefetch[0]) for w in workers]
    points: dict[tuple[int, int], float] = {}

    def point(w: int, p: int) -> None:
        r = timed_run(feeds, "DataLoader best", w, net, w, s["sweep_steps"], prefetch=p)
        points[(w, p)] = r["images_per_s"]
        print(f"  DataLoader sweep: {w:2d} workers, prefetch_factor {p}: {r['images_per_s']:7.0f} images/s "
              f"(data wait {r['wait_share']:.1%}; {r['run_s']:.1f} s)", flush=True)
        report("bench_gpu_train_sweep", feeds.args, {"model": s["sweep_model"], "workers": w, "prefetch_factor": p,
                                                     **r})

    print(f"DataLoader sweep on {s['sweep_model']} ({s['dl_sweep']}; {s['sweep_steps']} steps after 1 per worker):")
    for w, p in plan:
        point(w, p)
    if s["dl_sweep"] != "grid":
        best_w = max((w for w, _ in plan), key=lambda w: points[(w, prefetch[0])])
        for p in prefetch[1:]:
            point(best_w, p)
    feeds.dl_workers, feeds.dl_prefetch = max(points, key=points.__getitem__)
    print(f"  kept: {feeds.dl_workers} workers, prefetch_factor {feeds.dl_prefetch}")


def bench_model(name: str, feeds: Feeds, labels: list[str], workers: dict[str, int], repeats: int, warmup: dict,
                steps: int, needs_s: float | None = None) -> dict:
    """Every feed on model ``name``, ``repeats`` times interleaved (gpu_common.interleaved);
    each run's record as it ends; GPU clocks before and after each repeat. A repeat after the
    first starts only while the time left holds the last one's duration (``needs_s``: a run's
    estimate, for the first)."""
    net = make_model(name, feeds.device)
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    clocks, skipped, last_repeat_s = [gpu_clocks(f"{name} before repeat 0")], None, None
    order = interleaved(labels, repeats)
    for r in range(repeats):
        need = last_repeat_s if last_repeat_s is not None else (needs_s or 0) * len(labels)
        if seconds_left(feeds.args) < need:
            skipped = f"repeats {r} to {repeats - 1}: {seconds_left(feeds.args):.0f} s left, a repeat takes {need:.0f}"
            print(f"  {name}: {skipped}", flush=True)
            break
        began = time.perf_counter()
        for _, label in [o for o in order if o[0] == r]:
            result = timed_run(feeds, label, workers.get(label, 0), net, warmup[label], steps,
                               prefetch=feeds.dl_prefetch if label == "DataLoader best" else None)
            result["repeat"] = r
            if label == "DataLoader best":
                result["prefetch_factor"] = feeds.dl_prefetch
            runs[label].append(result)
            report("bench_gpu_train_run", feeds.args, {"model": name, "loader": label, **result})
        last_repeat_s = time.perf_counter() - began
        clocks.append(gpu_clocks(f"{name} after repeat {r}"))
    return {"feeds": {label: summarize(r) for label, r in runs.items() if r}, "ratios": ratios(runs),
            "clocks": clocks, "repeats_done": len({x["repeat"] for rs in runs.values() for x in rs}),
            "repeats_planned": repeats, "skipped": skipped}


def summarize(runs: list[dict]) -> dict:
    """A feed's runs: images/s min / median / max, the medians of the rest, and the runs."""
    rates = spread([r["images_per_s"] for r in runs])
    out = {"images_per_s": rates["median"], "images_per_s_min": rates["min"], "images_per_s_max": rates["max"]}
    for k in ("wait_share", "step_ms", "wait_ms", "host_wait_share", "h2d_gbps"):
        values = [r[k] for r in runs if r.get(k) is not None]
        if values:
            out[k] = statistics.median(values)
    return {**out, "runs": runs}


def ratios(runs: dict[str, list[dict]]) -> dict:
    """fastload's best mode (highest median images/s) against the better peer and the model
    alone of the same repeat: the per-repeat ratios, and their min and max."""
    by_repeat = {label: {r["repeat"]: r["images_per_s"] for r in rs} for label, rs in runs.items()}
    modes = [label for label in runs if label.startswith("fastload") and runs[label]]
    if not modes:
        return {}
    best = max(modes, key=lambda label: statistics.median(r["images_per_s"] for r in runs[label]))
    peers = [label for label in PEERS if runs.get(label)]
    better = {rep: max(by_repeat[p][rep] for p in peers if rep in by_repeat[p])
              for rep in by_repeat[best] if any(rep in by_repeat[p] for p in peers)}
    out: dict[str, Any] = {"best_mode": best}
    for key, den in (("vs_better_peer", better), ("vs_model_alone", by_repeat.get(ALONE, {}))):
        per = per_repeat_ratios(by_repeat[best], den)
        out[key] = {"per_repeat": per, **spread(per)}
    return out


def print_model(name: str, result: dict, bs: int, where: str) -> None:
    feeds = result["feeds"]
    print(f"{name}, bf16 autocast, channels_last, batch {bs}, on {where}; {result['repeats_done']} of "
          f"{result['repeats_planned']} repeat(s):")
    print(f"  {'feed':20s} {'workers':>7s} {'images/s min':>12s} {'median':>7s} {'max':>7s} {'data wait':>9s} "
          f"{'step ms':>8s} {'wait ms':>8s} {'host wait':>9s} {'h2d GB/s':>8s}")
    for label, r in feeds.items():
        h2d = f"{r['h2d_gbps']:8.1f}" if r.get("h2d_gbps") else f"{'-':>8s}"
        print(f"  {label:20s} {r['runs'][0]['workers']:7d} {r['images_per_s_min']:12.0f} {r['images_per_s']:7.0f} "
              f"{r['images_per_s_max']:7.0f} {r['wait_share']:9.1%} {r['step_ms']:8.1f} {r['wait_ms']:8.2f} "
              f"{r['host_wait_share']:9.1%} {h2d}")
    q = result["ratios"]
    for key, what in (("vs_better_peer", "the better peer"), ("vs_model_alone", "the model alone")):
        if q.get(key, {}).get("min") is not None:
            print(f"  {q['best_mode']} / {what} of the same repeat: {q[key]['min']:.2f}x to {q[key]['max']:.2f}x "
                  f"(median {q[key]['median']:.2f}x)")
    if result["skipped"]:
        print(f"  left out: {result['skipped']}")


def trace_modes(feeds: Feeds, modes: list[str], workers: int, steps: int, needs_s: float = 15.0) -> None:
    """Each of ``modes`` on ResNet-18, warmed up (``workers`` steps), then ``steps`` steps under
    torch.profiler (gpu_trace.py): its summary printed and reported; one started only while
    ``needs_s`` seconds are left."""
    net = make_model("resnet18", feeds.device)
    for mode in modes:
        if seconds_left(feeds.args) < needs_s:
            print(f"trace {mode}: skipped, {seconds_left(feeds.args):.0f} s left (a trace takes about {needs_s:.0f})")
            continue
        loader, batches = feeds.make(label_of(mode), workers)
        with feeding(loader, batches) as fed:
            run_steps(fed, net, feeds.device, max(workers, 1), 1)
            timed, events = gpu_trace.profiled(lambda: run_steps(fed, net, feeds.device, 1, steps), feeds.device)
        summary = gpu_trace.summarize(events, steps)
        print("\n".join(gpu_trace.lines(f"{label_of(mode)} on resnet18 ({timed['step_ms']:.1f} ms/step profiled)",
                                        summary)), flush=True)
        report("bench_gpu_train_trace", feeds.args, {"model": "resnet18", "mode": mode, "workers": workers,
                                                     "run": timed, "trace": summary})


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def arguments() -> Any:
    p = gpu_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=100, help="timed steps per run (default: 100)")
    p.add_argument("--repeats", type=int, default=3, help="ResNet-18 repeats of every feed (default: 3)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first in each run (default: 2 per worker: the batches the workers' first "
                        "rounds make at once are behind)")
    p.add_argument("--modes", default="cpu,gpu+cpu",
                   help="fastload's decode modes (cpu, gpu, gpu+cpu; gpu+cpu only where the Loader takes the "
                        "share option; default: cpu,gpu+cpu)")
    p.add_argument("--gpu-share", default="auto", help="the share option's value in the gpu+cpu mode (default: auto)")
    p.add_argument("--dl-workers", default="8,14,16", help="DataLoader worker counts swept (default: 8,14,16)")
    p.add_argument("--dl-prefetch", default="2,4,8", help="DataLoader prefetch_factors swept (default: 2,4,8)")
    p.add_argument("--dl-sweep", choices=("axes", "grid"), default="axes",
                   help="axes: every worker count at the first prefetch_factor, then every prefetch_factor at the "
                        "best count; grid: every pair (default: axes)")
    p.add_argument("--sweep-steps", type=int, default=20, help="timed steps per sweep point (default: 20)")
    p.add_argument("--r50-workers", type=int, default=4, help="ResNet-50's fastload workers (default: 4)")
    p.add_argument("--r50-repeats", type=int, default=1, help="ResNet-50 repeats (default: 1; 0: none)")
    p.add_argument("--r50-modes", default="best",
                   help="ResNet-50's fastload modes (default: best: gpu+cpu where the Loader takes the share option, "
                        "else cpu)")
    p.add_argument("--r50-all", action="store_true", help="ResNet-50 with the peers and the model alone too")
    p.add_argument("--trace", default="gpu,gpu+cpu,cpu",
                   help="fastload modes traced after ResNet-18's repeats (gpu_trace.py: device time per stream and "
                        "kind of work; default: gpu,gpu+cpu,cpu; empty: none)")
    p.add_argument("--trace-steps", type=int, default=8, help="steps profiled per traced mode (default: 8)")
    p.add_argument("--r50-needs", type=float, default=20.0,
                   help="seconds a ResNet-50 run is given in the plan: it starts only with that many left per run")
    return p


def sizes(args: Any) -> dict:
    """Batch, steps, workers, image size, repeats, the sweep, and the epoch (samples): twice
    the batches a run takes and the most its loader holds ahead, so no run reaches its end."""
    if args.quick:
        bs, steps, size, workers, repeats = 4, 2, 32, 2, 2
        dl_workers, dl_prefetch, sweep_steps, r50_workers = [1, 2], [2, 4], 1, 1
    else:
        bs, steps, size, workers, repeats = args.batch_size, args.steps, 224, args.workers, args.repeats
        dl_workers, dl_prefetch, sweep_steps = ints(args.dl_workers), ints(args.dl_prefetch), args.sweep_steps
        r50_workers = args.r50_workers
    most = max([workers, r50_workers, *dl_workers])
    warmup = (1 if args.quick else 2 * most) if args.warmup is None else args.warmup
    ahead = most * max([2, *dl_prefetch])
    return {"batch": bs, "steps": steps, "workers": workers, "size": size, "repeats": repeats,
            "dl_workers": dl_workers, "dl_prefetch": dl_prefetch, "dl_sweep": args.dl_sweep,
            "sweep_steps": sweep_steps, "sweep_model": "resnet18", "r50_workers": r50_workers,
            "r50_repeats": args.r50_repeats, "warmup_per_worker": None if args.warmup is not None else 2,
            "warmup": warmup, "epoch": 2 * (warmup + steps + ahead) * bs}


def warmups(s: dict, args: Any, labels: list[str], workers: dict[str, int]) -> dict[str, int]:
    """Warm-up steps of each feed: 2 per worker (1 in the dry run), or --warmup."""
    if args.warmup is not None:
        return dict.fromkeys(labels, args.warmup)
    per = 1 if args.quick else 2
    return {label: max(per * workers.get(label, 0), 2 * per) for label in labels}


def main() -> None:
    args = arguments().parse_args()
    device = device_or_exit(args, "bench_gpu_train")
    s = sizes(args)
    bs, steps, workers = s["batch"], s["steps"], s["workers"]
    modes = modes_list(args.modes) if not args.quick else modes_list("cpu,gpu,gpu+cpu")
    if device.type != "cuda":
        os.environ["FASTLOAD_GPU_DECODE_ON_CPU"] = "1"  # decode="gpu" on nvImageCodec's CPU backend
    runnable = [m for m in modes if mode_options(m) is not None]
    for m in sorted(set(modes) - set(runnable)):
        print(f"fastload mode {m}: skipped (this Loader takes no share option: gpu_common.GPU_SHARE_OPTION)")
    feeds = Feeds(args, device, bs, s["size"], s["epoch"])
    torch.backends.cudnn.benchmark = True
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "the CPU (dry run)"
    versions = {"torch": torch.__version__, "torchvision": feeds.torchvision.__version__,
                "timm": feeds.timm.__version__}
    print(f"versions: {', '.join(f'{k} {v}' for k, v in versions.items())}; fastload modes: {', '.join(runnable)}")
    sweep_net = make_model(s["sweep_model"], device)
    sweep_dataloader(feeds, sweep_net, s)
    del sweep_net
    fastloads = [label_of(m) for m in runnable]
    if args.quick or args.r50_modes != "best":
        r50 = [label_of(m) for m in (runnable if args.quick else modes_list(args.r50_modes))
               if mode_options(m) is not None]
    else:
        r50 = [label_of("gpu+cpu" if mode_options("gpu+cpu") is not None else "cpu")]
    plan = [("resnet18", [*fastloads, *PEERS, ALONE], workers, s["repeats"], None),
            ("resnet50", [*r50, *PEERS, ALONE] if args.r50_all else r50, s["r50_workers"], s["r50_repeats"],
             args.r50_needs)]
    traced = [m for m in modes_list(args.trace) if mode_options(m) is not None] if args.trace.strip() else []
    for name, labels, count, repeats, needs in plan:
        if repeats < 1:
            continue
        feed_workers = {label: count for label in labels if label != ALONE}
        if "DataLoader best" in labels:
            feed_workers["DataLoader best"] = feeds.dl_workers if name == s["sweep_model"] else count
        result = bench_model(name, feeds, labels, feed_workers, repeats, warmups(s, args, labels, feed_workers),
                             steps, needs)
        print_model(name, result, bs, where)
        report("bench_gpu_train", args, {"results": {name: result["feeds"]}, "ratios": {name: result["ratios"]},
                                         "clocks": {name: result["clocks"]}, "repeats": {name: result["repeats_done"]},
                                         "skipped": {name: result["skipped"]}, "batch_size": bs, "workers": count,
                                         "steps": steps, "warmup": s["warmup"], "versions": versions,
                                         "dataloader": {"workers": feeds.dl_workers,
                                                        "prefetch_factor": feeds.dl_prefetch},
                                         "epoch_batches": len(feeds.paths) // bs, "photos": feeds.root,
                                         "device": machine()})
        if name == "resnet18" and traced:  # after ResNet-18's repeats, before ResNet-50's run
            trace_modes(feeds, traced, workers, 2 if args.quick else args.trace_steps)
    print(f"(images/s min / median / max over the repeats of {steps} steps after {1 if args.quick else 2} warm-up "
          f"step(s) per worker, order "
          f"A B C ... C B A ...; step = GPU time between the ends of consecutive steps; data wait = from the end of "
          f"the previous step to the batch being ready on the training stream; host wait = time blocked in next())")


if __name__ == "__main__":
    main()
