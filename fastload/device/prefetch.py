"""The device stage: HostBatches → normalized N×C×H×W (channels_last) batches on the device.

On CUDA one side stream per prefetcher copies the next ``depth`` batches
(``non_blocking`` from pinned memory) and normalizes them while the training step runs.
Each batch gets its own ``ready`` event: the consumer stream waits for that batch only
(not for everything queued on the side stream, which would make ``depth`` > 1 useless),
and every handed-over tensor is ``record_stream``-ed on the consumer so the caching
allocator never reuses its memory while the step still reads it. The host buffer is
released with the event recorded right after its copy (also when a copy fails after
another was queued), so a reused buffer is rewritten only once the copy has read it.
Pageable labels are pinned first (their copy would otherwise wait for the side stream);
inputs already on a GPU are read only after the side stream waited for the stream that
made them. The stream is made at the first pass, on the device of that pass. On the CPU
the same numerics and layout are produced synchronously and the buffer is released
before the batch is handed out. ``tests/cudasim`` proves this ordering without a GPU
(docs/guides/gpu.md).
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..batch import HostBatch
from ..config import resolve_device
from ..views import batch_len, each, nbytes, same_memory, to_device
from .normalize import Normalizer

__all__ = ["CudaPrefetcher", "Normalizer", "Stats"]


class Stats:
    """Counters the prefetcher keeps; :meth:`as_dict` is what ``loader.stats()`` returns.

    ``wait_s`` is the time the consumer spent inside ``next()`` waiting for a batch;
    ``total_s`` runs from the first request of a pass to its last hand-over, so it holds
    the consumer's own steps too and ``wait_share`` is the share of time spent waiting.
    """

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


@dataclass
class _Queued:
    """A batch whose copy and normalization are queued on the side stream."""

    images: torch.Tensor | list[torch.Tensor]  # a list: one per view
    labels: torch.Tensor
    indices: torch.Tensor | None  # a host copy, when asked for
    extras: tuple  # what a user's batch carried after (images, labels), passed through
    ready: Any  # CUDA event after its normalization

    def outputs(self) -> tuple:
        return (self.images, self.labels) + ((self.indices,) if self.indices is not None else ()) + self.extras


def as_host_batch(item: Any) -> tuple[HostBatch, tuple]:
    """A HostBatch and the item's further fields: a HostBatch has none; a user's
    ``(images, labels, *extras)`` (e.g. ``(x, y, idx)``) keeps its extras, handed out as they are."""
    if isinstance(item, HostBatch):
        return item, ()
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise TypeError(
            f"CudaPrefetcher takes HostBatch or (uint8 images, labels, ...) items, got {type(item).__name__}"
        )
    images, labels = item[0], item[1]
    n = batch_len(images)
    return HostBatch(images, torch.as_tensor(labels), torch.full((n,), -1, dtype=torch.int64), -1), tuple(item[2:])


class CudaPrefetcher:
    """Overlaps host-to-device copies and normalization with the consumer's work.

    Iterates over ``iterable`` of HostBatches, or of (uint8 N×H×W×C images, labels[, lease])
    tuples, and yields (images, labels) on ``device`` (images: a list of N×C×H×W tensors, one
    per view, for multi-view batches) — (images, labels, indices) with
    ``indices``, the indices staying on the host. On a CPU device it normalizes synchronously.

    Args:
        iterable: The batches; a lease (a reused host buffer) is released once the
            buffer's copy is done.
        device: Target device; None means cuda if available, else cpu.
        depth: Batches in flight on the side stream.
        normalizer: Applied on the side stream (default: ImageNet float32).
        indices: Also yield each batch's int64 sample indices (a CPU copy).
        stream: The CUDA side stream to use (default: a new one).
    """

    def __init__(
        self,
        iterable: Iterable,
        device: Any = None,
        depth: int = 2,
        normalizer: Normalizer | None = None,
        indices: bool = False,
        stream: Any = None,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        self.iterable = iterable
        self.device = resolve_device(device)
        self.depth = depth
        self.normalizer = normalizer or Normalizer()
        self.indices = indices
        self.stats = Stats()
        if stream is not None and self.device.type != "cuda":
            raise ValueError(f"a CUDA stream was given for device {self.device}")
        self._stream = stream  # made at the first pass, on the device of that pass
        self._own_stream = stream is None
        self._timings: deque = deque()
        self._warned_unpinned = False
        self._closed = False

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.run(self.iterable)

    def run(self, iterable: Iterable) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Delivers the batches of ``iterable`` (one pass), timing the consumer's waits."""
        if self._closed:
            raise RuntimeError("CudaPrefetcher is closed")
        source = (as_host_batch(item) for item in iterable)
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        outputs = self._cpu(source) if self.device.type != "cuda" else self._cuda(source)
        first = None
        while True:
            asked = time.perf_counter()
            first = asked if first is None else first
            try:
                out = next(outputs)
            except StopIteration:
                return
            handed = time.perf_counter()
            self.stats.wait_s += handed - asked
            self.stats.total_s += handed - first
            first = handed
            self.stats.batches += 1
            yield out

    def _cpu(self, source: Iterator[tuple[HostBatch, tuple]]) -> Iterator[tuple[torch.Tensor, ...]]:
        for batch, extras in source:
            # Labels are copied: they may live in a reused buffer (tiny, so always).
            try:
                out = self.normalizer(to_device(batch.images, self.device)), batch.labels.to(self.device, copy=True)
            except BaseException:
                batch.release()
                raise
            if self.indices:
                out += (batch.indices.clone(),)
            if not same_memory(out[0], batch.images):
                batch.release()  # normalization copied the pixels: the buffer can be rewritten
            yield out + extras

    def set_device(self, device: torch.device) -> None:
        """Delivers the next passes to ``device`` (the Loader follows the process's GPU)."""
        if device == self.device:
            return
        if not self._own_stream:
            raise ValueError(f"this prefetcher's stream is on {self.device}, not {device}")
        if self._stream is not None:
            self._stream.synchronize()
        self.device, self._stream = device, None

    def _warn_unpinned(self) -> None:
        self.stats.unpinned += 1
        if not self._warned_unpinned:
            self._warned_unpinned = True
            warnings.warn(
                "fastload: a batch arrived in unpinned memory, so its host-to-device "
                "copy cannot overlap compute; pin it (Loader(pin_memory=True))",
                RuntimeWarning,
                stacklevel=5,
            )

    def _enqueue(self, batch: HostBatch, extras: tuple) -> _Queued:
        stream = self._stream
        images, labels = batch.images, batch.labels
        tensors = (*each(images), labels)  # every view of a multi-view batch, and the labels
        if not all(t.is_cuda or t.is_pinned() for t in each(images)):
            self._warn_unpinned()
        # Inputs already on a GPU were written by their producer's current stream: the side
        # stream waits for that work, and the allocator keeps them until the side stream read them.
        producers = {t.device: torch.cuda.current_stream(t.device) for t in tensors if t.is_cuda}
        start, copied = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ready = torch.cuda.Event()
        recorded = False
        try:
            with torch.cuda.stream(stream):  # (also the current device: pinning below uses its context)
                if not labels.is_cuda and not labels.is_pinned():
                    # Pageable labels (fast_collate's) would make their copy wait for the side
                    # stream: a pinned copy of a few bytes keeps it asynchronous.
                    labels = labels.pin_memory()
                for producer in producers.values():
                    stream.wait_stream(producer)
                for t in tensors:
                    if t.is_cuda and t.device == self.device:  # (a copy from another GPU syncs itself)
                        t.record_stream(stream)
                start.record(stream)
                images = to_device(images, self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
                copied.record(stream)
                recorded = True
                images = self.normalizer(images)
                ready.record(stream)
            indices = batch.indices.clone() if self.indices else None  # before the buffer goes back
        finally:
            # Also when a copy or the normalization failed: the event is recorded after whatever
            # was queued (one never recorded counts as complete, and the buffer would be rewritten
            # while a queued copy still reads it).
            if not recorded:
                copied.record(stream)
            batch.release(copied)  # a reused host buffer is rewritten only after its copy read it
        self._timings.append((start, copied, nbytes(batch.images)))
        return _Queued(images, labels, indices, extras, ready)

    def _collect_timings(self) -> None:
        # Only finished copies are read, so stats never block the host.
        while self._timings and self._timings[0][1].query():
            start, end, nbytes = self._timings.popleft()
            self.stats.h2d_s += start.elapsed_time(end) / 1000
            self.stats.h2d_bytes += nbytes

    def _cuda(self, source: Iterator[tuple[HostBatch, tuple]]) -> Iterator[tuple[torch.Tensor, ...]]:
        pending: deque[_Queued] = deque()
        for batch, extras in source:
            pending.append(self._enqueue(batch, extras))
            if len(pending) >= self.depth:
                break
        while pending:
            item = pending.popleft()
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(item.ready)
            if isinstance(item.images, list):  # a multi-view batch: every view
                for view in item.images:
                    view.record_stream(consumer)
            else:
                item.images.record_stream(consumer)
            item.labels.record_stream(consumer)
            nxt = next(source, None)  # start the next copy before the consumer's step
            if nxt is not None:
                pending.append(self._enqueue(*nxt))
            self._collect_timings()
            yield item.outputs()

    def close(self) -> None:
        """Waits for the side stream's pending work; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            self._stream.synchronize()
        self._timings.clear()

    def __enter__(self) -> CudaPrefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
