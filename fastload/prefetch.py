"""Deliver uint8 N×H×W×C batches to the device as normalized N×C×H×W (channels_last).

On CUDA, one side stream per prefetcher copies the next ``depth`` batches
(``non_blocking`` from pinned memory) and normalizes them while the current training
step runs. The consumer stream waits on the side stream before it gets a batch, and
every handed-over tensor is ``record_stream``-ed on the consumer, so the caching
allocator never hands its memory out while the step still reads it. On the CPU the
same numerics and layout are produced synchronously.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from .config import DTYPES, IMAGENET_MEAN, IMAGENET_STD


class Normalizer:
    """uint8 NHWC → (x/255 - mean)/std as N×C×H×W channels_last, in one multiply-add.

    Args:
        mean: Per-channel mean in [0, 1] units.
        std: Per-channel standard deviation in [0, 1] units.
        dtype: Output dtype name ("float32", "float16", "bfloat16").
        normalize: False returns the uint8 batch in the same N×C×H×W channels_last layout.
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 dtype: str = "float32", normalize: bool = True) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"mean {mean!r} and std {std!r} need one value per channel, std > 0")
        self.dtype = DTYPES[dtype]
        self.normalize = normalize
        # float64 → float32 once, so CPU and GPU use the very same constants.
        self._scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float64).float()
        self._shift = torch.tensor([m / s for m, s in zip(mean, std)], dtype=torch.float64).float()
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        pad = (0.0,) * (4 - len(std)) if len(std) <= 4 else ()
        self._cv_scale = tuple(float(v) for v in self._scale) + pad  # OpenCV takes 4-value scalars
        self._cv_shift = tuple(float(v) for v in self._shift) + pad

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on:
            self._on[device] = (self._scale.to(device), self._shift.to(device))
        return self._on[device]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise TypeError(f"expected a uint8 N×H×W×C batch, got {images.dtype} {tuple(images.shape)}")
        if not self.normalize:
            return images.permute(0, 3, 1, 2)
        if images.shape[-1] != len(self._scale):
            raise ValueError(f"batch has {images.shape[-1]} channels but mean/std have {len(self._scale)}")
        if images.device.type == "cpu" and images.is_contiguous() and images.shape[-1] <= 4:
            out = self._normalize_cpu(images)
        else:
            scale, shift = self._constants(images.device)
            out = images.to(torch.float32)
            out.mul_(scale).sub_(shift)
        if self.dtype != torch.float32:
            out = out.to(self.dtype)
        # A permute of contiguous NHWC is N×C×H×W with channels_last strides: no copy.
        return out.permute(0, 3, 1, 2)


    def _normalize_cpu(self, images: torch.Tensor) -> torch.Tensor:
        # OpenCV's per-channel multiply and subtract are vectorised and convert uint8 in
        # the same pass: about twice the speed of torch's to(float32).mul_().sub_().
        import cv2

        n, h, w, c = images.shape
        rows = images.numpy().reshape(n * h, w, c)
        out = cv2.multiply(rows, self._cv_scale, dtype=cv2.CV_32F)
        cv2.subtract(out, self._cv_shift, dst=out)
        return torch.from_numpy(out.reshape(n, h, w, c))


class Stats:
    """Counters the prefetcher keeps; :meth:`as_dict` is what ``loader.stats()`` returns."""

    def __init__(self) -> None:
        self.batches = 0
        self.wait_s = 0.0
        self.total_s = 0.0
        self.h2d_bytes = 0
        self.h2d_s = 0.0
        self.unpinned = 0

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "wait_s": self.wait_s,
            "wait_share": self.wait_s / self.total_s if self.total_s else 0.0,
            "wait_ms_per_batch": 1000 * self.wait_s / self.batches if self.batches else 0.0,
            "h2d_gbps": self.h2d_bytes / self.h2d_s / 1e9 if self.h2d_s else None,
            "unpinned_batches": self.unpinned,
        }


class CudaPrefetcher:
    """Overlaps host-to-device copies and normalization with the consumer's work.

    Iterates over ``iterable`` of (uint8 NHWC images, labels[, lease]) batches and yields
    (images, labels) on ``device``. On a CPU device it normalizes synchronously.

    Args:
        iterable: Yields (images, labels) or (images, labels, lease); a lease (a reused
            host buffer) is released once the buffer's copy is done.
        device: Target device; None means cuda if available, else cpu.
        depth: Batches in flight on the side stream.
        normalizer: Applied on the side stream (default: ImageNet float32).
    """

    def __init__(self, iterable: Iterable, device: Any = None, depth: int = 2,
                 normalizer: Normalizer | None = None) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        self.iterable = iterable
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.depth = depth
        self.normalizer = normalizer or Normalizer()
        self.stats = Stats()
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._pending: deque = deque()
        self._timings: deque = deque()
        self._warned_unpinned = False
        self._closed = False

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._closed:
            raise RuntimeError("CudaPrefetcher is closed")
        # Batches queued by an abandoned earlier pass must not leak into this one.
        self._pending.clear()
        source = iter(self.iterable)
        if self._stream is None:
            yield from self._iter_cpu(source)
        else:
            yield from self._iter_cuda(source)

    def _timed_next(self, source: Iterator) -> Any:
        start = time.perf_counter()
        try:
            return next(source)
        finally:
            self.stats.wait_s += time.perf_counter() - start

    def _iter_cpu(self, source: Iterator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        last = time.perf_counter()
        while True:
            try:
                batch = self._timed_next(source)
            except StopIteration:
                return
            images, labels = batch[0], batch[1]
            out = (self.normalizer(images.to(self.device)), labels.to(self.device))
            self._release(batch, None)
            now = time.perf_counter()
            self.stats.total_s += now - last
            self.stats.batches += 1
            yield out
            last = time.perf_counter()

    def _enqueue(self, source: Iterator) -> bool:
        try:
            batch = self._timed_next(source)
        except StopIteration:
            return False
        images, labels = batch[0], batch[1]
        if not images.is_pinned():
            self.stats.unpinned += 1
            if not self._warned_unpinned:
                self._warned_unpinned = True
                warnings.warn("fastload: a batch arrived in unpinned memory, so its host-to-device "
                              "copy cannot overlap compute; pin it (Loader(pin_memory=True))", RuntimeWarning,
                              stacklevel=3)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            start.record(self._stream)
            x = images.to(self.device, non_blocking=True)
            y = labels.to(self.device, non_blocking=True)
            end.record(self._stream)
            out = self.normalizer(x)
        self._release(batch, end)  # a reused host buffer is rewritten only after this copy
        self._timings.append((start, end, images.numel() * images.element_size()))
        # The host batch stays referenced until handed over, after its copy was enqueued.
        self._pending.append((out, y, images))
        return True

    @staticmethod
    def _release(batch: Any, event: Any) -> None:
        lease = batch[2] if len(batch) > 2 else None
        if lease is not None:
            lease.release(event)

    def _collect_timings(self) -> None:
        # Only finished copies are read, so stats never block the host.
        while self._timings and self._timings[0][1].query():
            start, end, nbytes = self._timings.popleft()
            self.stats.h2d_s += start.elapsed_time(end) / 1000
            self.stats.h2d_bytes += nbytes

    def _iter_cuda(self, source: Iterator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        last = time.perf_counter()
        for _ in range(self.depth):
            if not self._enqueue(source):
                break
        while self._pending:
            out, y, _host = self._pending.popleft()
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self._stream)
            out.record_stream(consumer)
            y.record_stream(consumer)
            self._enqueue(source)  # start the next copy before the consumer's step
            self._collect_timings()
            now = time.perf_counter()
            self.stats.total_s += now - last
            self.stats.batches += 1
            yield out, y
            last = time.perf_counter()

    def close(self) -> None:
        """Waits for the side stream's pending work and drops queued batches; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            self._stream.synchronize()
        self._pending.clear()
        self._timings.clear()

    def __enter__(self) -> CudaPrefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
