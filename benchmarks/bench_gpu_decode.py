"""GPU decode against the CPU default and against torchvision's GPU decode; timm's recipe.

1. Decode modes, RandomResizedCrop(224) + flip, normalized float batches of 256 on the GPU,
   14 workers each (--workers):
   - fastload decode="cpu" (the default): the workers decode, crop, resize and flip.
   - fastload decode="gpu": the workers read bytes and draw crops; the batch is decoded
     (nvImageCodec: nvJPEG), cropped, resized, flipped and normalized on the GPU. Where the
     Loader takes the share option (gpu_common.GPU_SHARE_OPTION) it is set to None here:
     the GPU decodes every row it can.
   - fastload "gpu+cpu" (--gpu-share, default auto): both decoders at once, decode="gpu"
     with the workers decoding a share of each batch on the CPU. Skipped, and said so, where
     the Loader does not take the option (the hook for that change).
   - torchvision decode_jpeg on the GPU, the peer: a DataLoader whose workers read the
     files' bytes (a list per batch), then ``torchvision.io.decode_jpeg(list, device="cuda")``
     decodes the batch at once, and each image is cropped (RandomResizedCrop's draw), resized
     to 224 (antialiased bilinear), flipped on the GPU, and the batch normalized. The same
     photos, crop size and batch. The dry run decodes with Pillow in its place.
   --repeats (3) repeats of fastload's modes, interleaved A B C ... C B A ..., the torchvision
   peer in the first repeat only (one run of ~16 s on an H200); each run a fresh
   loader, 2 batches per worker of warm-up, then --batches (100) timed ones. Per mode:
   images/s min / median / max, and CPU seconds per image (user + system of this process
   and its workers over the timed window, gpu_common.CpuMeter); the ratios to decode="cpu"
   of the same repeat (min and max).
2. timm's ImageNet recipe (rand-m9-mstd0.5-inc1, RandomErasing 0.25 "pixel", Mixup 0.8 /
   CutMix 1.0, label smoothing 0.1): fastload (RandAugment in the workers, RandomErasing and
   Mixup on the GPU as its batch stage) against timm's create_loader with its prefetcher
   and FastCollateMixup, the same repeats. Not a target of issue 38: --recipe auto runs it
   only while the time left (--time-limit) holds --recipe-needs seconds.

GPU clocks, temperature and throttle reasons are read before and after every repeat. A
repeat after the first starts only while the time left holds the last one's duration.
One JSON record when the decode part ends, and one with both parts at the end. --quick:
the dry run on the CPU, decode="gpu" on nvImageCodec's CPU backend
(``FASTLOAD_GPU_DECODE_ON_CPU=1``), tiny sizes.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from bench_recipe import AA, _timm  # _timm: timm.data with its posterize fixed for Pillow >= 10
from common import report
from gpu_common import (
    CpuMeter,
    device_or_exit,
    feeding,
    gpu_clocks,
    gpu_parser,
    import_peers,
    interleaved,
    mode_options,
    modes_list,
    per_repeat_ratios,
    photos,
    pil_decode,
    read_bytes,
    repeat,
    seconds_left,
    share_value,
    spread,
    sync,
)

import fastload as fl
from fastload.config import IMAGENET_MEAN, IMAGENET_STD

TORCHVISION = "torchvision decode_jpeg cuda"
# loader.stats() counts recorded with each fastload run: where its rows were decoded.
ROW_STATS = ("gpu_decoded_rows", "cpu_share_rows", "cpu_fallback_rows", "gpu_cpu_share")
SIZE = 224


def timed(make: Callable[[], Any], warmup: int, batches: int, device: torch.device) -> dict:
    """One run of a fresh loader: images/s of ``batches`` after ``warmup`` (the device's
    queued work included), CPU seconds per image over the timed window, and the run's phases."""
    began = time.perf_counter()
    made = make()
    loader, it = made if isinstance(made, tuple) else (made, None)
    with feeding(loader, it) as fed:
        for _ in range(warmup):
            next(fed)
        sync(device)
        meter = CpuMeter()
        meter.start()
        start, images = time.perf_counter(), 0
        for _ in range(batches):
            images += next(fed)[0].shape[0]
        sync(device)
        seconds = time.perf_counter() - start
        cpu = meter.stop()
        stats = loader.stats() if isinstance(loader, fl.Loader) else {}
        closing = time.perf_counter()
        del loader, it, made
    ended = time.perf_counter()
    return {"images_per_s": images / seconds, "cpu_s_per_image": cpu / images if cpu is not None else None,
            "cpu_main_s_per_image": meter.main_seconds / images if meter.main_seconds is not None else None,
            "cpu_threads_ms_per_image": [(name, 1e3 * t / images) for name, t in meter.threads],
            "rows": {k: stats[k] for k in ROW_STATS if k in stats},
            "timed_s": seconds, "warmup_s": start - began, "close_s": ended - closing, "run_s": ended - began,
            "batches": batches}


def repeats_of(makers: dict[str, Callable[[], Any]], repeats: int, warmup: int, batches: int, device: torch.device,
               args: Any, part: str, once: tuple[str, ...] = ()) -> dict:
    """Every maker ``repeats`` times, interleaved (those named in ``once`` in the first repeat
    only); each run printed and recorded as it ends. A repeat's duration, for the next one's
    fit, counts the runs that repeat."""
    runs: dict[str, list[dict]] = {name: [] for name in makers}
    clocks, skipped, last = [gpu_clocks(f"{part} before repeat 0")], None, None
    order = [(r, name) for r, name in interleaved(list(makers), repeats) if r == 0 or name not in once]
    for r in range(repeats):
        if last is not None and seconds_left(args) < last:
            skipped = f"repeats {r} to {repeats - 1}: {seconds_left(args):.0f} s left, a repeat takes {last:.0f}"
            print(f"  {skipped}", flush=True)
            break
        began, not_again = time.perf_counter(), 0.0
        for _, name in [o for o in order if o[0] == r]:
            result = {**timed(makers[name], warmup, batches, device), "repeat": r}
            runs[name].append(result)
            if name in once:
                not_again += result["run_s"]
            cpu = f"{1e3 * result['cpu_s_per_image']:.2f} CPU ms/image" if result["cpu_s_per_image"] else "CPU -"
            if result.get("cpu_main_s_per_image") is not None:
                busiest = ", ".join(f"{n} {ms:.2f}" for n, ms in result["cpu_threads_ms_per_image"][:4])
                cpu += f" (main process {1e3 * result['cpu_main_s_per_image']:.2f}: {busiest}; rows {result['rows']})"
            print(f"  {name}: {result['images_per_s']:.0f} images/s, {cpu} (repeat {r}; {result['run_s']:.1f} s)",
                  flush=True)
            report("bench_gpu_decode_run", args, {"part": part, "mode": name, **result})
        last = time.perf_counter() - began - not_again
        clocks.append(gpu_clocks(f"{part} after repeat {r}"))
    modes = {}
    for name, rs in runs.items():
        if rs:
            rates = spread([x["images_per_s"] for x in rs])
            cpu = [x["cpu_s_per_image"] for x in rs if x["cpu_s_per_image"] is not None]
            modes[name] = {"images_per_s": rates["median"], "images_per_s_min": rates["min"],
                           "images_per_s_max": rates["max"], "cpu_s_per_image": statistics.median(cpu) if cpu else None,
                           "runs": rs}
    return {"modes": modes, "clocks": clocks, "skipped": skipped,
            "repeats_done": len({x["repeat"] for rs in runs.values() for x in rs}), "repeats_planned": repeats}


def ratio(part: dict, num: str, den: str) -> dict | None:
    """num / den per repeat (min, median, max and each), or None where either did not run."""
    modes = part["modes"]
    if num not in modes or den not in modes:
        return None
    per = per_repeat_ratios({x["repeat"]: x["images_per_s"] for x in modes[num]["runs"]},
                            {x["repeat"]: x["images_per_s"] for x in modes[den]["runs"]})
    return {"per_repeat": per, **spread(per)}


# --- the peer: torchvision's batched decode_jpeg on the GPU, crops on the GPU ---


class FileBytes(torch.utils.data.Dataset):
    """(the file's bytes as a uint8 tensor, label): all a worker does for the GPU-decode peer."""

    def __init__(self, root: str, paths: list[str], labels: list[int]) -> None:
        self.root, self.paths, self.labels = root, paths, labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return read_bytes(os.path.join(self.root, self.paths[i])), self.labels[i]


def bytes_collate(batch: list) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [data for data, _ in batch], torch.tensor([label for _, label in batch], dtype=torch.int64)


def crop_box(height: int, width: int, rng: random.Random, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> tuple:
    """RandomResizedCrop's draw (torchvision's algorithm): (top, left, height, width)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class TorchvisionGpu:
    """Batches of the torchvision peer: each batch's bytes decoded at once by
    ``decode_jpeg(list, device=...)`` (Pillow per image in the dry run), then per image the
    crop, an antialiased bilinear resize to SIZE and the flip on the device, then the batch
    normalized there."""

    def __init__(self, loader: Any, device: torch.device, decode: Callable[[list], list], seed: int = 0) -> None:
        self.loader, self.device, self.decode = loader, device, decode
        self.rng = random.Random(seed)
        self.mean = 255 * torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
        self.std = 255 * torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for datas, labels in self.loader:
            images = self.decode(datas)
            out = torch.empty(len(images), 3, SIZE, SIZE, device=self.device)
            for i, image in enumerate(images):
                image = image.to(self.device, non_blocking=True)
                if image.shape[0] == 1:
                    image = image.expand(3, -1, -1)
                top, left, h, w = crop_box(image.shape[1], image.shape[2], self.rng)
                crop = image[None, :, top:top + h, left:left + w].float()
                resized = torch.nn.functional.interpolate(crop, size=(SIZE, SIZE), mode="bilinear",
                                                          align_corners=False, antialias=True)
                out[i] = resized[0].flip(-1) if self.rng.random() < 0.5 else resized[0]
            yield out.sub_(self.mean).div_(self.std), labels.to(self.device, non_blocking=True)


def batch_decoder(device: torch.device, quick: bool) -> Callable[[list], list]:
    """torchvision.io.decode_jpeg of a list on ``device`` (RGB); Pillow per image in the dry run."""
    if device.type != "cuda":
        if not quick:
            raise SystemExit("the torchvision peer decodes on a GPU")
        print(f"{TORCHVISION}: no GPU here, Pillow stands in (dry run)")
        return lambda datas: [pil_decode(d) for d in datas]
    from torchvision.io import ImageReadMode, decode_jpeg

    return lambda datas: decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)


def timm_recipe(data: Any, root: str, n: int, bs: int, workers: int, classes: int, device: torch.device) -> Any:
    """timm's create_loader + FastCollateMixup, as its train.py runs the recipe on a GPU."""
    ds = data.ImageDataset(root)
    ds.reader.samples = repeat(ds.reader.samples, n)
    mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=classes)
    return data.create_loader(
        ds, input_size=(3, 224, 224), batch_size=bs, is_training=True, use_prefetcher=True, re_prob=0.25,
        re_mode="pixel", re_count=1, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, color_jitter=0.4,
        auto_augment=AA, interpolation="random", mean=IMAGENET_MEAN, std=IMAGENET_STD, num_workers=workers,
        collate_fn=data.FastCollateMixup(**mix), pin_memory=device.type == "cuda", persistent_workers=True,
        device=device)


def arguments() -> Any:
    p = gpu_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=100, help="timed batches per run (default: 100)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of every mode (default: 3)")
    p.add_argument("--modes", default="cpu,gpu,gpu+cpu",
                   help="fastload's decode modes (default: cpu,gpu,gpu+cpu; gpu+cpu only where the Loader takes the "
                        "share option), the torchvision peer always (in the first repeat)")
    p.add_argument("--gpu-share", default="auto", help="the share option's value in the gpu+cpu mode (default: auto)")
    p.add_argument("--recipe", choices=("auto", "on", "off"), default="auto",
                   help="timm's recipe part: auto runs it only with --recipe-needs seconds left (default: auto)")
    p.add_argument("--recipe-needs", type=float, default=75.0, help="seconds the recipe part needs (default: 75)")
    return p


def sizes(args: Any) -> dict:
    """Batch, workers, warm-up and timed batches, repeats, and the epoch (samples): every run's
    warm-up and timed batches and what its workers hold ahead, twice, within one epoch."""
    if args.quick:
        bs, workers, batches, repeats = 8, 2, 2, 2
    else:
        bs, workers, batches, repeats = args.batch_size, args.workers, args.batches, args.repeats
    warmup = 2 * workers
    return {"batch": bs, "workers": workers, "warmup": warmup, "timed": batches, "repeats": repeats,
            "epoch": 2 * (warmup + batches + 4 * workers) * bs}


def main() -> None:
    args = arguments().parse_args()
    device = device_or_exit(args, "bench_gpu_decode")
    if device.type != "cuda":
        os.environ["FASTLOAD_GPU_DECODE_ON_CPU"] = "1"
    root, paths, labels = photos(args)
    classes = max(labels) + 1
    size = sizes(args)
    bs, workers, warmup, timed_batches, n = size["batch"], size["workers"], size["warmup"], size["timed"], size["epoch"]
    paths, labels = repeat(paths, n), repeat(labels, n)
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "the CPU (dry run)"
    share = share_value(args.gpu_share)

    def fastload(options: dict, recipe: bool = False) -> Callable[[], fl.Loader]:
        tf = fl.transforms.train(SIZE, auto_augment=AA if recipe else None)
        stage = [fl.augment.RandomErasing(0.25, mode="pixel", device=device),
                 fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=classes)]
        ds = fl.ImageList.from_arrays(paths, labels, root, transform=tf)
        return lambda: fl.Loader(ds, batch_size=bs, num_workers=workers, shuffle=True, drop_last=True, device=device,
                                 seed=0, batch_transform=stage if recipe else None, **options)

    decode_batch = batch_decoder(device, args.quick)

    def torchvision_gpu() -> tuple[Any, Iterator]:
        loader = torch.utils.data.DataLoader(FileBytes(root, paths, labels), batch_size=bs, shuffle=True,
                                             drop_last=True, num_workers=workers, collate_fn=bytes_collate,
                                             persistent_workers=True)
        return loader, iter(TorchvisionGpu(loader, device, decode_batch))

    makers: dict[str, Callable[[], Any]] = {}
    for mode in modes_list(args.modes):
        options = mode_options(mode, share)
        if options is None:
            print(f"decode mode {mode}: skipped (this Loader takes no share option: gpu_common.GPU_SHARE_OPTION)")
            continue
        makers[mode] = fastload(options)
    makers[TORCHVISION] = torchvision_gpu
    print(f"decode: {len(set(paths))} photos, RandomResizedCrop({SIZE}) + flip + normalize, batch {bs}, {workers} "
          f"workers, on {where}; {size['repeats']} repeats of {timed_batches} timed batches after {warmup}, "
          f"interleaved:")
    # The peer runs once: at 2,097 images/s (H200, 2026-11-27) it took about 16 s a run, and
    # three repeats of every mode did not fit the step's 115 s.
    decode = repeats_of(makers, size["repeats"], warmup, timed_batches, device, args, "decode", once=(TORCHVISION,))
    ratios = {f"{num}/cpu": ratio(decode, num, "cpu") for num in decode["modes"] if num != "cpu"}
    ratios["gpu/" + TORCHVISION] = ratio(decode, "gpu", TORCHVISION)
    for name, q in ratios.items():
        if q:
            print(f"  {name}: {q['min']:.2f}x to {q['max']:.2f}x over the repeats (median {q['median']:.2f}x)")
    for name, m in decode["modes"].items():
        cpu = f"{1e3 * m['cpu_s_per_image']:.2f} CPU ms/image" if m["cpu_s_per_image"] else "CPU seconds not read"
        print(f"  {name:30s} images/s {m['images_per_s_min']:.0f} / {m['images_per_s']:.0f} / "
              f"{m['images_per_s_max']:.0f} (min / median / max); {cpu}")
    gpu_cpu = ratios.get("gpu/cpu")
    result = {"decode": decode["modes"], "ratios": ratios, "clocks": {"decode": decode["clocks"]},
              "repeats": decode["repeats_done"], "skipped": decode["skipped"],
              "gpu_vs_cpu": gpu_cpu["median"] if gpu_cpu else None, "batch_size": bs, "workers": workers,
              "timed_batches": timed_batches, "warmup_batches": warmup, "photos": root,
              "share_option": mode_options("gpu+cpu", share) is not None}
    report("bench_gpu_decode", args, result)  # now: a run stopped in the recipe part keeps it

    if args.recipe == "off" or (args.recipe == "auto" and seconds_left(args) < args.recipe_needs):
        why = "--recipe off" if args.recipe == "off" else f"{seconds_left(args):.0f} s left of {args.recipe_needs:.0f}"
        print(f"timm recipe: skipped ({why})")
        report("bench_gpu_decode", args, {**result, "recipe_skipped": why})
        return
    import_peers(args.quick)  # torchvision's own, before _timm stubs its compiled ops for the dry run
    data = _timm()
    import timm

    print(f"timm recipe (timm {timm.__version__}): batch {bs}, {workers} workers, "
          f"batch stage on {device.type}; {size['repeats']} repeats of {timed_batches} timed batches after {warmup}:")
    recipe = repeats_of({"fastload": fastload({}, recipe=True),
                         "timm": lambda: timm_recipe(data, root, n, bs, workers, classes, device)},
                        size["repeats"], warmup, timed_batches, device, args, "recipe")
    recipe_ratio = ratio(recipe, "fastload", "timm")
    if recipe_ratio:
        print(f"  fastload / timm prefetcher + FastCollateMixup: {recipe_ratio['min']:.2f}x to "
              f"{recipe_ratio['max']:.2f}x (median {recipe_ratio['median']:.2f}x)")
    report("bench_gpu_decode", args, {**result, "recipe": recipe["modes"], "recipe_ratio": recipe_ratio,
                                      "fastload_vs_timm": recipe_ratio["median"] if recipe_ratio else None,
                                      "timm_version": timm.__version__,
                                      "clocks": {**result["clocks"], "recipe": recipe["clocks"]}})


if __name__ == "__main__":
    main()
