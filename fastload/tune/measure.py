"""Measure one loader configuration: steady-state samples/s, CPU use, memory (USS/PSS)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
import torch

from ..config import LoaderConfig
from ..datasets.base import ImageDataset
from ..loader import Loader
from ..sources.build import DEVICE_AHEAD

#: Fewest batches in a timed window, however short ``seconds`` makes it: a window of one or
#: two large batches measures when those happen to arrive (two workers finish theirs
#: together), not the rate.
MIN_WINDOW_BATCHES = 3

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, ValueError, IndexError):
            pass
    return total


def memory(pids: list[int]) -> dict:
    """Summed USS and PSS (bytes) of ``pids`` from /proc/PID/smaps_rollup."""
    uss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in ("Private_Clean", "Private_Dirty"):
                        uss += int(rest.split()[0]) * 1024
                    elif key == "Pss":
                        pss += int(rest.split()[0]) * 1024
        except OSError:
            pass
    return {"uss": uss, "pss": pss}


def warmup_batches(config: LoaderConfig) -> int:
    """Batches taken before timing: the first two (workers started, first batches through),
    then as many as the pipeline holds ready (each worker's ``prefetch_factor``, and the device
    stage's :data:`~fastload.sources.build.DEVICE_AHEAD`). Those were made while the loop
    waited on the first ones: a window that starts by taking them times a burst, not the rate."""
    return 2 + int(config.num_workers) * config.prefetch_factor + DEVICE_AHEAD


def measure_loader(dataset: Any, config: LoaderConfig, seconds: float, windows: int = 3) -> dict:
    """Runs a Loader until warm (:func:`warmup_batches`), then ``windows`` timed windows of
    ``seconds / windows`` each and at least :data:`MIN_WINDOW_BATCHES` batches, taking
    batches as a training loop does: the Loader as configured (normalized on its device
    unless ``config.normalize`` is False), epoch after epoch.

    Returns:
        samples_per_s (median of windows), windows, cpu_percent (of the CPUs in use by
        main + workers, 100 per core), peak_uss / peak_pss (main + workers, bytes) and,
        on CUDA, peak_gpu_bytes.
    """
    cuda = torch.device(config.device or "cpu").type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    me = os.getpid()
    with Loader(dataset, config) as loader:
        epoch = 0

        def batches():
            nonlocal epoch
            while True:
                loader.set_epoch(epoch)
                epoch += 1
                yield from loader

        it = batches()
        for _ in range(warmup_batches(config)):
            next(it)
        pids = [me, *_children(me)]
        peak = memory(pids)
        rates = []
        ticks0, t0 = _cpu_ticks(pids), time.perf_counter()
        for _ in range(windows):
            start, images, taken = time.perf_counter(), 0, 0
            while time.perf_counter() - start < seconds / windows or taken < MIN_WINDOW_BATCHES:
                x, _ = next(it)
                images, taken = images + x.shape[0], taken + 1
            rates.append(images / (time.perf_counter() - start))
            now = memory(pids)
            peak = {k: max(peak[k], now[k]) for k in peak}
        cpu = (_cpu_ticks(pids) - ticks0) / _TICK / (time.perf_counter() - t0) * 100
        if cuda:
            torch.cuda.synchronize()
    result = {
        "samples_per_s": statistics.median(rates),
        "windows": rates,
        "cpu_percent": cpu,
        "peak_uss": peak["uss"],
        "peak_pss": peak["pss"],
    }
    if cuda:
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    return result


class BytesOnly(ImageDataset):
    """Reads each sample's bytes and returns a 1×1 image: storage cost alone."""

    def __init__(self, dataset: ImageDataset) -> None:
        super().__init__(None)
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def load(self, index: int, epoch: int = 0, seed: int = 0, out: np.ndarray | None = None):
        data, label = self.dataset.read(index)
        return np.full((1, 1, 3), len(data) % 256, np.uint8), label


class Synthetic(ImageDataset):
    """One in-memory image repeated: collate, hand-over and transfer cost alone."""

    def __init__(self, n: int, shape: tuple[int, ...]) -> None:
        super().__init__(np.zeros(n, np.int64))
        self.image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)

    def load(self, index: int, epoch: int = 0, seed: int = 0, out: np.ndarray | None = None):
        return self.image, 0


def decode_rate_per_core(dataset: ImageDataset, seconds: float) -> tuple[float, tuple[int, ...]]:
    """Samples/s of read + decode + transform in this process, and the output shape."""
    n, start, shape = 0, time.perf_counter(), ()
    while time.perf_counter() - start < seconds:
        img, _ = dataset.load(n % len(dataset), 0, 0)
        shape = tuple(img.shape)
        n += 1
    return n / (time.perf_counter() - start), shape


def bottleneck(dataset: ImageDataset, config: LoaderConfig, pipeline_rate: float, seconds: float) -> dict:
    """Stage rates at ``config`` and which stage bounds the pipeline."""
    per_core, shape = decode_rate_per_core(dataset, seconds)
    workers = max(1, int(config.num_workers))  # the tuner's configurations name their workers
    stages = {
        "storage": measure_loader(BytesOnly(dataset), config, seconds)["samples_per_s"],
        "decode+transform": per_core * workers,
        "collate+transfer": measure_loader(Synthetic(len(dataset), shape), config, seconds)["samples_per_s"],
    }
    bound = min(stages, key=lambda stage: stages[stage])
    share = pipeline_rate / stages[bound] if stages[bound] else 0.0
    return {
        "stages_samples_per_s": stages,
        "decode_per_core": per_core,
        "bound_by": bound,
        "pipeline_share_of_bound": share,
    }
