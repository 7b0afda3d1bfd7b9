"""What the GPU check's steps share (benchmarks/GPU.md): their arguments, the device (or the
dry run's CPU), the photo set, long epochs, the peers' imports and the GPU's timing.

Every step runs on the CPU with ``--quick`` (the dry run, tests/test_gpu_suite.py): the
same code with small sizes, torchvision's compiled ops stubbed where they do not load
(``tests/refs.py``), and CUDA-only calls (events, streams, ``torch.cuda._sleep``) behind
the ``cuda`` branches below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import math
import os
import statistics
import sys
import time
import types
from collections.abc import Iterator, Sequence
from typing import Any

import gpu_photos
import torch
from common import ROOT, parser

import fastload as fl

QUICK_PHOTOS = 32  # the dry run's photo set: 4 batches of 8
STARTED = time.monotonic()  # this step's process began (about): --time-limit counts from here
CLOSE_MARGIN_S = 5.0  # of --time-limit, kept for ending the last loader and writing the records

# The Loader keyword of both decoders at once (decode="gpu" with a share of each batch decoded
# by the workers on the CPU): ``gpu_cpu_share`` ("auto", None, or a share in [0, 1]) on the
# branch that adds it. Until the Loader accepts it, the "gpu+cpu" mode is skipped (and said);
# where it lands under another name, change it here only.
GPU_SHARE_OPTION = "gpu_cpu_share"

# fastload's decode modes: "cpu" (the default), "gpu" (every row the GPU can take decoded there:
# the share option, where accepted, set to None), "gpu+cpu" (both at once: --gpu-share).
MODES = ("cpu", "gpu", "gpu+cpu")


def gpu_parser(description: str, workers: int = 14) -> Any:
    """common.parser (--quick, --data, --images, --json) plus --photos and --workers."""
    p = parser(description)
    p.set_defaults(images=8192)
    p.add_argument("--photos", default=None, help="a set built by gpu_photos.py (default: built under --data)")
    p.add_argument("--workers", type=int, default=workers, help=f"loader workers (default: {workers})")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds this process has (gpu_check passes its step's limit): optional parts that would "
                        "not fit are skipped and said so, never cut off half-way")
    return p


def seconds_left(args: Any) -> float:
    """Of --time-limit, what is left (less CLOSE_MARGIN_S); infinite without one."""
    if getattr(args, "time_limit", None) is None:
        return math.inf
    return args.time_limit - CLOSE_MARGIN_S - (time.monotonic() - STARTED)


def share_accepted() -> bool:
    """Whether this fastload's Loader takes GPU_SHARE_OPTION (the "gpu+cpu" mode's hook): a
    keyword of Loader itself, or a field of the LoaderConfig its ``**options`` fill."""
    if GPU_SHARE_OPTION in inspect.signature(fl.Loader.__init__).parameters:
        return True
    try:
        from fastload.config import LoaderConfig

        return GPU_SHARE_OPTION in {f.name for f in dataclasses.fields(LoaderConfig)}
    except (ImportError, TypeError):
        return False


def mode_options(mode: str, share: Any = "auto") -> dict | None:
    """The Loader keywords of a decode mode; None where this Loader cannot run it ("gpu+cpu"
    without GPU_SHARE_OPTION)."""
    if mode == "cpu":
        return {"decode": "cpu"}
    if mode == "gpu":
        return {"decode": "gpu", **({GPU_SHARE_OPTION: None} if share_accepted() else {})}
    if mode == "gpu+cpu":
        return {"decode": "gpu", GPU_SHARE_OPTION: share} if share_accepted() else None
    raise ValueError(f"unknown decode mode {mode!r}; the modes: {', '.join(MODES)}")


def share_value(text: str) -> Any:
    """--gpu-share's value as the option takes it: "auto", None ("none") or a number."""
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def modes_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise SystemExit(f"unknown decode mode(s) {unknown or text!r}; the modes: {', '.join(MODES)}")
    return modes


def interleaved(labels: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, label) in the order A B C, C B A, A B C, ...: a drift over the call (clocks,
    temperature, page cache) falls on every label alike."""
    order = []
    for r in range(repeats):
        order += [(r, label) for label in (labels if r % 2 == 0 else list(reversed(labels)))]
    return order


def spread(values: Sequence[float]) -> dict:
    """min, median and max of ``values`` (all None where there are none)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def per_repeat_ratios(num: dict[int, float], den: dict[int, float]) -> list[float]:
    """num[r] / den[r] for every repeat r both have (repeat -> images/s)."""
    return [num[r] / den[r] for r in sorted(num) if r in den and den[r]]


def gpu_clocks(when: str) -> dict:
    """The GPU's clocks, temperature and throttle reasons now (read only; gpu_check.gpu_clocks)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_check

    return {"when": when, **gpu_check.gpu_clocks()}


class CpuMeter:
    """CPU seconds (user + system) of this process and every process below it (the loaders'
    workers), between start() and stop(): psutil where it is installed, else /proc (Linux).
    A worker that exits inside the window is counted up to its last reading only, so the
    window is always taken with the loader's workers alive (after warm-up, before close)."""

    def __init__(self) -> None:
        self.before: dict[int, float] = {}
        self.seconds: float | None = None
        self.main_seconds: float | None = None  # this process alone (the device driver's threads)
        self.threads_before: dict[int, tuple[str, float]] = {}
        self.threads: list[tuple[str, float]] = []  # this process's busiest threads: (name, seconds)

    @staticmethod
    def readings() -> dict[int, float] | None:
        try:
            import psutil
        except ImportError:
            psutil = None
        if psutil is not None:
            me = psutil.Process()
            out = {}
            for proc in [me, *me.children(recursive=True)]:
                try:
                    t = proc.cpu_times()
                    out[proc.pid] = t.user + t.system
                except psutil.Error:
                    continue
            return out
        if not os.path.isdir("/proc/self"):
            return None
        return _proc_readings()

    def start(self) -> None:
        self.before = self.readings() or {}
        self.threads_before = _thread_readings()

    def stop(self) -> float | None:
        after = self.readings()
        if after is None:
            return None
        self.seconds = sum(t - self.before.get(pid, 0.0) for pid, t in after.items())
        me = os.getpid()
        if me in after:
            self.main_seconds = after[me] - self.before.get(me, 0.0)
        threads = _thread_readings()
        spent = [(f"{name} ({tid})", t - self.threads_before.get(tid, (name, 0.0))[1])
                 for tid, (name, t) in threads.items()]
        self.threads = sorted(spent, key=lambda x: -x[1])[:8]
        return self.seconds


def _thread_readings() -> dict[int, tuple[str, float]]:
    """tid -> (name, user + system CPU seconds) of this process's threads, from /proc (empty elsewhere)."""
    tick, out = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100, {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            fields = rest.split()
            out[int(tid)] = (head.partition("(")[2], (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError, IndexError):
            continue
    return out


def _proc_readings() -> dict[int, float]:
    """pid -> user + system CPU seconds of this process and its descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, used = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(fields[1])
        used[pid] = (int(fields[11]) + int(fields[12])) / tick
    me, mine = os.getpid(), {}
    for pid in used:
        p = pid
        while p > 1 and p != me:
            p = parent.get(p, 0)
        if p == me:
            mine[pid] = used[pid]
    return mine


def device_or_exit(args: Any, name: str) -> torch.device:
    """cuda; the CPU under --quick (the dry run). Without CUDA and --quick: says so and exits 0
    (``make bench`` runs every benchmark on the CPU)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if args.quick:
        torch.set_num_threads(1)  # on a busy machine, several threads per op spin against each other
        return torch.device("cpu")
    print(f"{name} needs a CUDA GPU (make gpu-check runs it on one); --quick runs it on the CPU")
    raise SystemExit(0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def photos(args: Any) -> tuple[str, list[str], list[int]]:
    """(root, relative paths, labels) of the photo set: --photos (built by the photos step),
    else one built here under --data (QUICK_PHOTOS of them with --quick)."""
    if args.photos:
        root = args.photos
        gpu_photos.check(root)
    else:
        n = QUICK_PHOTOS if args.quick else args.images
        root = gpu_photos.build(os.path.join(args.data, f"gpu-photos-{n}"), n, workers=2 if args.quick else None)
    paths, labels = gpu_photos.photo_list(root)
    return root, paths, labels


def repeat(items: list, n: int) -> list:
    """``items`` repeated to ``n`` (an epoch longer than the photo set: no run reaches its end,
    so no loader pays an epoch end inside a timed run)."""
    return (items * math.ceil(n / len(items)))[:n]


@contextlib.contextmanager
def feeding(loader: Any, batches: Iterator | None = None) -> Iterator[Iterator]:
    """``batches`` (default: a pass over ``loader``) for one run, everything ended after it:
    idle workers of an earlier run would go on making batches on the cores of the next."""
    batches = iter(loader) if batches is None else batches
    try:
        yield batches
    finally:
        if isinstance(batches, types.GeneratorType):
            batches.close()
        if isinstance(loader, fl.Loader):
            loader.close()
        del loader, batches
        gc.collect()  # DataLoader workers end when their iterator is freed


def import_peers(quick: bool) -> tuple[Any, Any]:
    """(torchvision, timm). Under --quick, torchvision's compiled ops are stubbed first (this
    machine's torchvision is a CUDA build beside a CPU torch: tests/refs.py)."""
    if quick:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import refs

        refs.stub_meta_registrations()
    import timm
    import timm.data
    import torchvision

    return torchvision, timm


def read_bytes(path: str) -> torch.Tensor:
    """A file's bytes as a uint8 tensor (torchvision.io.read_file without its compiled op)."""
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def jpeg_decoder(torchvision: Any, quick: bool, probe: str) -> Any:
    """torchvision.io.decode_jpeg to RGB (a DataLoader user's fastest CPU decode), tried on the
    JPEG ``probe``. Where its compiled op does not load (allowed under --quick only), Pillow
    stands in, said so."""
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(data: torch.Tensor) -> torch.Tensor:
        return decode_jpeg(data, mode=ImageReadMode.RGB)

    try:
        decode(read_bytes(probe))
    except RuntimeError as e:
        if not quick:
            raise
        print(f"torchvision.io.decode_jpeg does not run here ({str(e).splitlines()[0][:80]}): Pillow stands in")
        return pil_decode
    return decode


def pil_decode(data: torch.Tensor) -> torch.Tensor:
    """The dry run's stand-in for decode_jpeg: RGB uint8 C×H×W."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data.numpy().tobytes())) as img:
        return torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1)


class Clock:
    """Marks on the current stream (CUDA events), or host time on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def settle(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # once, after the timed loop: the events are read back
