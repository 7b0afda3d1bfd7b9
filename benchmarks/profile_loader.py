"""Where fastload's time goes per sample on the real-photo dataset.

Two views:

1. ``--stages``: each stage of the training pipeline timed on its own in one process,
   in microseconds per sample (read, header parse, planning, decode, resize, flip,
   collate, normalization), plus the process backend's batch hand-over (IPC).
2. A sampling profile of the real loader (all processes), summed by stage::

       py-spy record --subprocesses --format raw -o spy.txt --duration 20 -- \\
           python benchmarks/profile_loader.py --seconds 25 [--backend thread]
       python benchmarks/profile_loader.py --aggregate spy.txt

   Without ``--stages``/``--aggregate`` this script just keeps the training loader busy
   (batch 128, uint8 out, as in bench_loader's headline row) for the profiler.
"""

from __future__ import annotations

import collections
import math
import time

import numpy as np
import torch
from common import cpu_seconds, median, parser, photo_folder, report

import fastload as fl
from fastload.collate import fast_collate
from fastload.datasets.base import sample_rng
from fastload.decode import get_decoder, plan, read_header
from fastload.decode.libjpeg import scaled_size, scratch
from fastload.device.prefetch import Normalizer
from fastload.system import available_cpus

# First match walking a stack from its innermost frame outwards names the stage.
STAGES = (
    ("start-up (imports, dataset scan, workers)", ("_find_and_load", "photo_folder", "jpeg_stats", "_start_workers",
                                                   "__init__ (fastload/loader.py", "Popen")),
    ("header parse", ("read_header", "_jpeg_header", "image_size", "check_jpeg_complete", "is_jpeg")),
    ("decode", ("_decode_jpeg (fastload/decode", "decode (fastload/decode/roi.py", "imdecode", "decode_jpeg")),
    ("planning (rng, crop plan, decode plan)", ("sample_rng", "plan (fastload/transforms/crops.py", "default_rng",
                                                "choose (fastload/decode/plan.py")),
    ("resize", ("resize (fastload/decode/resize.py", "resize_box (fastload", "resize_window (fastload",
                "apply (fastload/decode/resize.py")),
    ("flip", ("apply_inplace", "RandomHorizontalFlip")),
    ("collate (thread backend: copy into the batch)", ("_finish (fastload/threaded.py",)),
    ("collate", ("fast_collate", "alloc_batch", "_new_shared")),
    ("normalization / layout", ("_normalize_cpu", "Normalizer", "__call__ (fastload/device/prefetch.py")),
    ("read", ("read (fastload/datasets", "read (fastload/datasets/storage")),
    ("IPC (pickle, shared memory, pipes)", ("multiprocessing/", "reductions.py", "rebuild_storage", "pickle",
                                            "_recv", "_send", "recv_bytes", "send_bytes")),
    ("worker loop / DataLoader", ("torch/utils/data",)),
    ("thread backend scheduling", ("fastload/threaded.py", "concurrent/futures", "threading.py")),
)


# An innermost frame that blocks: py-spy's idle filter lets some of these through.
WAITING = "waiting (blocked in wait/select/accept/poll)"
BLOCKING = ("Condition.wait", "Event.wait", "select (", "Selector.select", "accept (", "socket.accept", "poll (",
            "_wait_for_tstate_lock", "sleep")


def stage_of(stack: str) -> str:
    frames = stack.split(";")
    if any(k in frames[-1] for k in BLOCKING):
        return WAITING
    for frame in reversed(frames):
        for name, keys in STAGES:
            if any(k in frame for k in keys):
                return name
    return "other"


def aggregate(path: str, top: int = 12) -> dict:
    """Sums a py-spy raw profile by stage and by innermost frame; start-up is shown apart."""
    stages: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        stages[stage_of(stack)] += int(count)
        leaves[stack.split(";")[-1].split(" (")[0]] += int(count)
    startup = stages.pop(STAGES[0][0], 0)
    waiting = stages.pop(WAITING, 0)
    total = sum(stages.values())
    print(f"{total} samples in the steady state, all processes (left out: {startup} in start-up, {waiting} "
          f"blocked), by stage:")
    shares = {k: v / total for k, v in stages.most_common()}
    for name, share in shares.items():
        print(f"  {share:6.1%}  {name}")
    print("by innermost frame:")
    for name, count in leaves.most_common(top):
        print(f"  {count / (total + startup):6.1%}  {name}")
    return {"stages": shares, "startup_samples": startup, "waiting_samples": waiting}


def per_sample_us(fn, items: list, passes: int) -> float:
    """Median over passes (after a warm-up pass) of the CPU time of this thread per item of
    ``fn(item)``, in µs: CPU time, so that other jobs on a shared machine do not count."""
    times = []
    for i in range(passes + 1):
        start = time.thread_time()
        for item in items:
            fn(item)
        if i:
            times.append(time.thread_time() - start)
    return median(times) / len(items) * 1e6


def handover_cpu_us(batches: list, workers: int, passes: int) -> float:
    """CPU per image (all processes) of DataLoader workers returning collated batches of
    pre-decoded samples to the main process: collate + IPC, nothing else."""
    class Ready(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(batches)

        def __getitem__(self, i: int):
            return fast_collate(batches[i])

    loader = torch.utils.data.DataLoader(Ready(), batch_size=None, num_workers=workers, persistent_workers=True)
    for _ in loader:  # start the workers
        pass
    pids = [w.pid for w in loader._iterator._workers]
    before = time.process_time(), [cpu_seconds(p) for p in pids]
    images = 0
    for _ in range(max(passes, 3)):
        images += sum(x.shape[0] for x, _ in loader)
    spent = time.process_time() - before[0] + sum(cpu_seconds(p) - b for p, b in zip(pids, before[1]))
    del loader
    return spent / images * 1e6


def stages(root: str, batch_size: int, passes: int) -> dict:
    """Each stage of the train pipeline (process backend's path) timed alone, µs per sample.

    Decodes follow the plans the default pipeline makes (strict: full or DCT-scaled;
    region decodes too under ``FASTLOAD_ROI=trusted``)."""
    torch.set_num_threads(1)  # as in a DataLoader worker
    tf = fl.transforms.train(224)
    ds = fl.ImageFolder(root, transform=tf)
    dec = get_decoder(ds.decoder)
    crop_t, flip_t = tf.transforms[0], tf.transforms[1]
    idx = list(range(len(ds)))
    data = [ds.read(i)[0] for i in idx]
    headers = [read_header(b) for b in data]
    crops = [crop_t.plan(hd.height, hd.width, sample_rng(0, 0, i)) for i, hd in zip(idx, headers)]
    planner = plan.get_planner()
    plans = [planner.choose(hd, c) if _planned(hd) else None for hd, c in zip(headers, crops)]
    slot = np.empty((224, 224, 3), np.uint8)

    def decode(i):
        if plans[i] is None:
            return dec.decode(data[i], header=headers[i])
        hd = headers[i]
        buf = None if plans[i].region else scratch(math.prod(scaled_size(hd, plans[i].scale)) * 3)
        return plans[i].decode(data[i], dec, hd, out=buf)

    decoded = [np.array(decode(i)) for i in idx]

    def resize(i):
        p, hd = plans[i], headers[i]
        if p is None:
            return crops[i].apply(decoded[i], hd.height, hd.width, slot)
        return crops[i].apply(decoded[i], hd.height, hd.width, slot, float(p.scale), p.origin)

    resized = [resize(i).copy() for i in idx]
    samples = [(img, 0) for img in resized]
    batches = [samples[i:i + batch_size] for i in range(0, len(samples), batch_size)]
    shape = (batch_size, *resized[0].shape)
    batch = fast_collate(batches[0], pin=False)[0]
    out = {
        "read (file open + read)": per_sample_us(lambda i: ds.read(i), idx, passes),
        "header parse (SOF scan)": per_sample_us(read_header, data, passes),
        "planning (sample rng + RandomResizedCrop plan + decode plan)": per_sample_us(
            lambda i: planner.choose(headers[i], crop_t.plan(headers[i].height, headers[i].width,
                                                             sample_rng(0, 0, i))), idx, passes),
        "decode as planned (into the thread's buffer)": per_sample_us(decode, idx, passes),
        "decode, full (into the thread's buffer; reference)": per_sample_us(
            lambda i: dec.decode(data[i], header=headers[i], out=scratch(headers[i].height * headers[i].width * 3)),
            idx, passes),
        "decode, full (new array each; reference)": per_sample_us(
            lambda i: dec.decode(data[i], header=headers[i]), idx, passes),
        "resize (crop + antialiased resize into the batch slot)": per_sample_us(resize, idx, passes),
        "flip (draw + view)": per_sample_us(lambda i: flip_t(resized[i], sample_rng(0, 0, i)), idx, passes)
        - per_sample_us(lambda i: sample_rng(0, 0, i), idx, passes),
        "collate (fast_collate into a new batch)": per_sample_us(
            lambda b: fast_collate(b, pin=False), batches, passes) * len(batches) / len(samples),
        "normalization (uint8 out: NCHW channels_last view)": per_sample_us(
            Normalizer(normalize=False), [batch] * 4, passes) / batch_size,
        "normalization (float32 on the CPU, normalize=True)": per_sample_us(
            Normalizer(), [batch] * 4, passes) / batch_size,
    }
    # In a worker the batch goes to new shared memory, then through a pipe (fd + metadata).
    shared = per_sample_us(lambda b: torch.UntypedStorage._new_shared(math.prod(shape)), batches, passes)
    out["collate (in a worker: + new shared-memory segment)"] = (
        out["collate (fast_collate into a new batch)"] + shared * len(batches) / len(samples))
    handover = handover_cpu_us(batches, 2, passes)
    out["hand-over CPU, all processes (2 workers: collate + IPC)"] = handover
    out["IPC (hand-over CPU minus collate in a worker)"] = handover - out[
        "collate (in a worker: + new shared-memory segment)"]
    out["ImageFolder.load (read + header + plan + decode + resize + flip)"] = per_sample_us(
        lambda i: ds.load(i, 0, 0, out=slot), idx, passes)
    print(f"train 224, stages timed alone in one process (one torch thread), {len(ds)} photos, batch {batch_size}, "
          f"median of {passes} passes (CPU µs per sample); decoder {dec.name}, region decode "
          f"{'on' if planner.region else 'off'}:")
    for name, us in out.items():
        print(f"  {name:66s} {us:8.1f}")
    shares = {"train": plan_shares(headers, plans)}
    ev = fl.transforms.eval(224)
    shares["eval"] = plan_shares(headers, [planner.choose(hd, ev.plan(hd.height, hd.width, sample_rng(0, 0, i)))
                                           if _planned(hd) else None for i, hd in zip(idx, headers)])
    for name, share in shares.items():
        print(f"plans the {name} pipeline makes (steady state): " + ", ".join(f"{k} {v:.1%}" for k, v in share.items()))
    return {**out, "plan_shares": shares, "decoder": dec.name, "region_decode": planner.region}


def _planned(header) -> bool:
    """Whether the planner serves this image (JPEG, not CMYK), as in Compose.decode."""
    return header.format == "jpeg" and header.components != 4


def plan_shares(headers: list, plans: list) -> dict:
    """Share of samples per plan kind (None: not planned, decoded whole)."""
    counts = collections.Counter(p.kind if p is not None else "not planned" for p in plans)
    return {k: v / len(plans) for k, v in counts.most_common()}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--seconds", type=float, default=12)
    p.add_argument("--backend", default="process")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--normalize", action="store_true", help="float output normalized on the CPU")
    p.add_argument("--stages", action="store_true", help="time each stage alone in one process")
    p.add_argument("--aggregate", default=None, metavar="SPY.txt", help="sum a py-spy raw profile and exit")
    args = p.parse_args()
    if args.aggregate:
        report("profile_loader", args, aggregate(args.aggregate))
        return
    root = photo_folder(args, quiet=not args.stages)
    bs = 8 if args.quick else args.batch_size
    if args.stages:
        report("profile_loader", args, {"stage_us": stages(root, bs, 1 if args.quick else 3)})
        return
    ds = fl.ImageFolder(root, transform=fl.transforms.train(224))
    seconds = 1 if args.quick else args.seconds
    images, start, epoch = 0, time.perf_counter(), 0
    with fl.Loader(ds, batch_size=bs, num_workers=available_cpus(), shuffle=True, device="cpu",
                   backend=args.backend, normalize=args.normalize) as loader:
        while time.perf_counter() - start < seconds:
            loader.set_epoch(epoch)
            epoch += 1
            images += sum(y.shape[0] for _, y in loader)
    print(f"ran the training loader for {time.perf_counter() - start:.1f} s: {images} images")
    report("profile_loader", args, {"images": images})


if __name__ == "__main__":
    main()
