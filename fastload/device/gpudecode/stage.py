"""The device stage of ``decode="gpu"``: EncodedBatches → normalized N×C×H×W batches.

Each batch is decoded in one nvImageCodec call (regions where the worker planned them),
then every row is cut, resized (``interpolate(mode="bilinear", antialias=True)``) and
written into one buffer; flips, the rows decoded on the CPU, rounding and normalization
are batch-wide. On CUDA all of it is queued on the stage's own stream, ``depth`` batches
ahead of the consumer, by the stage's own thread (the decoder call blocks its thread, and
a batch takes a few kernel launches per row), with no host synchronization: the training
thread only makes the consumer stream wait on each batch's event, its outputs are
``record_stream``-ed there, and what nvImageCodec and the workers own (decoded images,
encoded bytes) is dropped only once that event has passed.
On the CPU (the stand-in the tests run) the resize runs on uint8, the CPU path's kernel.

A row the decoder refuses is loaded by the CPU path in this process, as
``decode="cpu"`` would load it, under the loader's error policy: its error names the
sample's file; a replacement under ``on_error="skip"`` is reported like the workers'.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...batch import SkippedSample
from ...sources.fetch import BatchFetcher, put
from ...targets import fill
from ..normalize import Normalizer
from ..prefetch import Stats
from .encoded import EncodedBatch
from .nvdecode import BatchDecoder

CLOSE_WAIT_S = 2.0  # close() waits this long for the batch being decoded (a fall-back load may hang)


@dataclass
class _Decoded:
    """A batch queued on the stage's stream."""

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor | None
    ready: Any  # CUDA event after its last kernel; None on the CPU
    keep: list = field(default_factory=list)  # what the queued kernels read: kept until ``ready`` has passed


class GpuDecodeStage:
    """Decodes, crops, resizes, flips and normalizes EncodedBatches on ``device``.

    Has the device-stage surface of :class:`fastload.CudaPrefetcher` (``run``, ``stats``,
    ``close``); yields (images, labels) or (images, labels, indices).

    Args:
        device: A CUDA device, or the CPU (nvImageCodec's CPU backend, for tests).
        depth: Batches queued ahead of the consumer on CUDA.
        normalizer: Applied after the resize (the same as the CPU path's).
        indices: Also yield each batch's int64 sample indices (a CPU copy).
        fetcher: Loads a row the decoder refuses by the CPU path, with the error policy.
        on_skipped: Called with the samples such a load replaced (``on_error="skip"``).
        resize_dtype: What the resize computes in: None for uint8 on the CPU (the CPU
            path's kernel) and float32 on CUDA (the CUDA kernel takes floats; rounded once).
    """

    def __init__(
        self,
        device: torch.device,
        depth: int,
        normalizer: Normalizer,
        indices: bool,
        fetcher: BatchFetcher,
        on_skipped: Callable[[tuple[SkippedSample, ...]], None] | None = None,
        resize_dtype: torch.dtype | None = None,
    ) -> None:
        self.device = device
        self.resize_dtype = resize_dtype or (torch.uint8 if device.type == "cpu" else torch.float32)
        self.depth = depth
        self.normalizer = normalizer
        self.indices = indices
        self.fetcher = fetcher
        self.stats = Stats()
        self.fallbacks = 0  # rows the decoder refused, loaded by the CPU path here
        # A bound method is held weakly: the Loader's would keep the Loader alive through its stage.
        self._on_skipped: Callable[[], Any] | None = None
        if on_skipped is not None:
            self._on_skipped = weakref.WeakMethod(on_skipped) if hasattr(on_skipped, "__self__") else lambda: on_skipped
        self._stream: Any = None  # made at the first pass, on the device of that pass
        self._decoder: BatchDecoder | None = None
        self._executor: ThreadPoolExecutor | None = None  # the thread that decodes and launches (CUDA)
        self._last: Future | None = None  # the batch it was given last
        self._held: deque[tuple[Any, list]] = deque()  # (ready, keep) of the batches queued
        self._closed = False

    def run(self, iterable: Iterable[EncodedBatch]) -> Iterator[tuple[torch.Tensor, ...]]:
        """Delivers the batches of ``iterable`` (one pass), timing the consumer's waits."""
        if self._closed:
            raise RuntimeError("GpuDecodeStage is closed")
        if self._decoder is None:
            self._decoder = BatchDecoder(self.device)
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        outputs = self._cpu(iter(iterable)) if self.device.type != "cuda" else self._cuda(iter(iterable))
        asked = since = time.perf_counter()
        for out in outputs:
            # The wait: from the consumer's request (the end of its step) to the hand-over.
            now = time.perf_counter()
            self.stats.wait_s += now - asked
            self.stats.total_s += now - since
            self.stats.batches += 1
            since = now
            yield out
            asked = time.perf_counter()

    def set_device(self, device: torch.device) -> None:
        """Decodes the next passes on ``device`` (the Loader follows the process's GPU)."""
        if device == self.device:
            return
        if self._stream is not None:
            self._stream.synchronize()
        self._held.clear()
        self.device, self._stream, self._decoder = device, None, None

    def _cpu(self, source: Iterator[EncodedBatch]) -> Iterator[tuple[torch.Tensor, ...]]:
        for batch in source:
            yield self._output(self._decode(batch))

    def _cuda(self, source: Iterator[EncodedBatch]) -> Iterator[tuple[torch.Tensor, ...]]:
        # The decoder call (which blocks its thread) and the per-row kernels run on the stage's
        # own thread, in order; the training thread only waits for each batch's event.
        worker = self._worker()
        queued: deque[Future] = deque()
        try:
            while True:
                # ``depth`` batches queued on the stream before one is handed over, the next one
                # queued before the consumer's step.
                while len(queued) < self.depth:
                    batch = next(source, None)
                    if batch is None:
                        break
                    queued.append(self._submit(worker, batch))
                if not queued:
                    return
                item = queued.popleft().result()
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_event(item.ready)  # this batch only, not all the stream's work
                for t in (item.images, item.labels):
                    t.record_stream(consumer)  # not reused while the consumer's step reads it
                if len(queued) < self.depth:
                    nxt = next(source, None)
                    if nxt is not None:
                        queued.append(self._submit(worker, nxt))
                self._drop_finished()
                yield self._output(item)
        finally:
            for f in queued:  # an abandoned pass: what has not started never will
                f.cancel()

    def _worker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="fastload-gpu-decode")
        return self._executor

    def _submit(self, worker: ThreadPoolExecutor, batch: EncodedBatch) -> Future:
        self._last = worker.submit(self._enqueue, batch)
        return self._last

    def _enqueue(self, batch: EncodedBatch) -> _Decoded:
        with torch.cuda.stream(self._stream):
            item = self._decode(batch, self._stream.cuda_stream)
            item.ready = torch.cuda.Event()
            item.ready.record(self._stream)
        # Batches run in order on the stream: what each uses is dropped once its event has passed.
        self._held.append((item.ready, item.keep))
        return item

    def _drop_finished(self) -> None:
        # Only passed events are read, so this never blocks the host.
        while self._held and self._held[0][0].query():
            self._held.popleft()

    def _output(self, item: _Decoded) -> tuple[torch.Tensor, ...]:
        out = (item.images, item.labels)
        return out if item.indices is None else (*out, item.indices)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self._stream is None:
            return t
        # Pinned, so the copy is queued on the stream without blocking the host; the
        # caching host allocator keeps the pinned block until the copy has run.
        return t.pin_memory().to(self.device, non_blocking=True)

    def _decode(self, batch: EncodedBatch, cuda_stream: int = 0) -> _Decoded:
        n = len(batch)
        out_h, out_w = batch.out_size
        work = self.resize_dtype
        rows = torch.empty((n, 3, out_h, out_w), dtype=work, device=self.device, memory_format=torch.channels_last)
        tensors, keep = self._decoder.decode(batch, cuda_stream)
        refused, flipped = [], []
        for r, img in enumerate(tensors):
            j = int(batch.rows[r])
            if img is None:
                refused.append(r)
                continue
            y0, x0, y1, x1 = (int(v) for v in batch.boxes[r])
            x = img[y0:y1, x0:x1].permute(2, 0, 1).unsqueeze(0)
            x = F.interpolate(
                x if work is torch.uint8 else x.float(),
                size=tuple(int(v) for v in batch.resize[r]),
                mode="bilinear",
                antialias=True,
                align_corners=False,
            )
            wy, wx = (int(v) for v in batch.windows[r])
            rows[j].copy_(x[0, :, wy : wy + out_h, wx : wx + out_w])
            if batch.flips[r]:
                flipped.append(j)
        if flipped:
            at = self._to_device(torch.tensor(flipped, dtype=torch.int64))
            rows.index_copy_(0, at, rows.index_select(0, at).flip(-1))
        if work is not torch.uint8:
            rows.round_().clamp_(0, 255)
        labels, indices = batch.labels, batch.indices
        pixels, at = batch.decoded, batch.decoded_rows
        if refused:
            labels, indices = labels.clone(), indices.clone()
            more = self._load_on_cpu(batch, refused, labels, indices)
            pixels, at = torch.cat([pixels, more]), np.concatenate([at, batch.rows[refused]])
        if len(at):
            host = self._to_device(pixels)
            rows.index_copy_(0, self._to_device(torch.from_numpy(at)), host.permute(0, 3, 1, 2).to(work))
        images = self.normalizer(rows.to(torch.uint8).permute(0, 2, 3, 1))  # NHWC view, contiguous
        keep += [tensors, batch]
        return _Decoded(images, self._to_device(labels), indices.clone() if self.indices else None, None, keep)

    def _load_on_cpu(
        self, batch: EncodedBatch, refused: list[int], labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """The refused encoded rows loaded by the CPU path (updating ``labels`` and
        ``indices`` where a row was replaced), as uint8 M×H×W×3."""
        out = torch.empty((len(refused), *batch.out_size, 3), dtype=torch.uint8)
        pixels = out.numpy()
        skipped: list[SkippedSample] = []
        consumer = len(self.fetcher.inflight) - 1  # the in-flight row kept for this process
        for k, r in enumerate(refused):
            j, slot = int(batch.rows[r]), pixels[k]
            item = self.fetcher.load(int(batch.indices[j]), batch.epoch, consumer, slot, seed=batch.seed)
            put(slot, item, self.fetcher)
            fill(labels[j : j + 1], [item.label], lambda _: self.fetcher.samples.title_of(item.index))
            indices[j] = item.index
            skipped.extend(item.skipped)
        self.fallbacks += len(refused)
        report = self._on_skipped() if self._on_skipped is not None else None
        if skipped and report is not None:
            report(tuple(skipped))
        return out

    def close(self) -> None:
        """Waits for the stream's pending work and drops what it held; idempotent."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
            if self._last is not None:  # the batch it is on is queued on the stream before the wait below,
                wait([self._last], timeout=CLOSE_WAIT_S)  # unless a fall-back load is stuck in a sample
        if not self._closed and self._stream is not None:
            self._stream.synchronize()
        self._closed = True
        self._held.clear()
