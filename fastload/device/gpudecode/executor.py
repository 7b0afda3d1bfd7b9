"""The executor of ``decode="gpu"``: EncodedBatches → uint8 batches on the device, for the driver.

Each batch is decoded in one nvImageCodec call (regions where the worker planned them),
then every row is cut, resized (``interpolate(mode="bilinear", antialias=True)``),
windowed, flipped and rounded into one uint8 buffer in one step (:mod:`.rows`: on CUDA one
Triton kernel launch for the batch); the rows decoded on the CPU are copied in; the device
driver normalizes and hands it over (:mod:`fastload.device.driver`). On CUDA all of it is
queued on a driver thread's own stream by that thread (the decoder call blocks its
thread), with no host synchronization; what nvImageCodec and the workers own (decoded
images, encoded bytes) is the batch's ``keep``, dropped by the driver once the batch's
event has passed. On the CPU (the stand-in the tests run) the resize runs on uint8, the CPU
path's kernel, so the pixels are the CPU path's.

A row the decoder refuses is loaded by the CPU path in this process, as ``decode="cpu"``
would load it, under the loader's error policy (:mod:`.refused`: an indexed dataset's by its
index, a stream's from the bytes its batch carries): its error names the sample's file or
record; a replacement under ``on_error="skip"`` is reported like the workers'. A stream's
records that failed (in the worker, or here) are holes, filled from good rows of their batch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np
import torch

from ...batch import SampleError, SkippedSample
from ...encoded import EncodedBatch
from ...sources.fetch import SampleLoader
from ...views import each
from ..staged import Placement, Staged
from .nvdecode import SIZE_HINT, BatchDecoder
from .refused import neighbour_rows, refused_rows
from .rows import METHODS, resize_rows

__all__ = ["DECODE_THREADS", "GpuDecode", "decode_threads"]

#: Batches decoded at once by default, each on a driver thread with its own decoder and
#: stream: one thread leaves the GPU idle while it prepares and launches a batch's work.
DECODE_THREADS = 2


def decode_threads() -> int:
    """Driver threads decoding at once: ``FASTLOAD_GPU_DECODE_THREADS``, else :data:`DECODE_THREADS`."""
    raw = os.environ.get("FASTLOAD_GPU_DECODE_THREADS", "").strip()
    if not raw:
        return DECODE_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"FASTLOAD_GPU_DECODE_THREADS must be an int >= 1, got {raw!r}")
    return int(raw)


class GpuDecode:
    """Decodes, crops, resizes and flips EncodedBatches on the driver's device.

    Args:
        fallback: Loads a row the decoder refuses by the CPU path, with the error policy
            (the row loader of the source whose workers made the batches).
        on_skipped: Called with the samples such a load replaced (``on_error="skip"``).
        resize: How rows are resized (:func:`.rows.resize_rows`): ``"auto"`` runs the
            Triton kernel on CUDA (a float32 loop of ``F.interpolate`` without Triton) and
            the CPU path's uint8 kernel on the CPU; ``"triton"``, ``"float"`` or ``"uint8"``
            to choose.
        threads: Batches decoded at once on CUDA, each on a driver thread with its own
            decoder and stream (default: ``FASTLOAD_GPU_DECODE_THREADS``, else 2).
        decoder_threads: CPU threads for each nvImageCodec decoder; None: at most 4
            (nvdecode.default_threads).

    Raises:
        ValueError: ``threads`` is not an int >= 1, or ``resize`` not one of :data:`.rows.METHODS`.
    """

    def __init__(
        self,
        fallback: SampleLoader,
        on_skipped: Callable[[tuple[SkippedSample, ...]], None] | None = None,
        resize: str = "auto",
        threads: int | None = None,
        decoder_threads: int | None = None,
    ) -> None:
        threads = decode_threads() if threads is None else threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if resize not in METHODS:
            raise ValueError(f"resize must be one of {METHODS}, got {resize!r}")
        self.fallback = fallback
        # The rows the decoder refuses are a batch of the CPU path's (fallback None: none is loaded).
        self._refused = refused_rows(fallback) if fallback is not None else None
        self.on_skipped = on_skipped
        self.resize = resize
        # The decoder call blocks its thread: the driver runs ``threads`` batches at once, each
        # on its own thread and stream, with a decoder of that thread's own.
        self.threads = threads
        self.decoder_threads = decoder_threads
        self._local = threading.local()  # a thread's decoder, made on the device of its first batch
        self._fallback_lock = threading.Lock()  # the row loader keeps one in-flight row for this process

    def stage(self, batch: EncodedBatch, at: Placement) -> Staged:
        # Nothing here gives a worker's buffer back: a batch arrives copied out of it (detached).
        assert batch.data_lease is None and batch.decoded_lease is None, "a GPU batch still in a worker's buffer"
        decoder = getattr(self._local, "decoder", None)
        if decoder is None or decoder.device != at.device:
            # Preallocated for the first batch: its size and its median image (the batches of
            # one loader are alike).
            decoder = self._local.decoder = BatchDecoder(
                at.device, threads=self.decoder_threads, batch_size=max(len(batch), 1), image_size=typical_size(batch)
            )
        if at.stream is None:
            return self._decode(batch, at, decoder)
        with torch.cuda.stream(at.stream):
            return self._decode(batch, at, decoder)

    def _to_device(self, t: torch.Tensor, at: Placement) -> torch.Tensor:
        if at.stream is None:
            return t
        # Pinned, so the copy is queued on the stream without blocking the host; the
        # caching host allocator keeps the pinned block until the copy has run.
        return t.pin_memory().to(at.device, non_blocking=True)

    def _decode(self, batch: EncodedBatch, at: Placement, decoder: BatchDecoder) -> Staged:
        n = len(batch)
        # One uint8 batch per view (a multi-view transform's), every view cut from one decode.
        tables = batch.views()
        outs = [
            torch.empty((n, 3, *t.out_size), dtype=torch.uint8, device=at.device, memory_format=torch.channels_last)
            for t in tables
        ]
        tensors, keep = decoder.decode(batch, at.stream.cuda_stream if at.stream is not None else 0)
        done = [r for r, img in enumerate(tensors) if img is not None]
        refused = [r for r, img in enumerate(tensors) if img is None]
        decoded = [t for t in tensors if t is not None]
        for out, t in zip(outs, tables):
            resize_rows(
                out,
                decoded,
                t.boxes[done],
                t.resize[done],
                t.windows[done],
                t.flips[done],
                batch.rows[done],
                self.resize,
            )
        labels, indices = batch.labels.clone(), batch.indices.clone()  # a refused row or a hole changes them
        pixels, where = each(batch.decoded), batch.decoded_rows
        holes = [int(j) for j in batch.holes]
        skipped = batch.skipped
        if refused:
            assert self._refused is not None
            consumer = len(self.fallback.inflight) - 1  # the in-flight row kept for this process
            with self._fallback_lock:
                rebuilt = self._refused.load(batch, refused, consumer)
            places = [int(batch.rows[r]) for r in refused]
            for k, j in enumerate(places):
                labels[j], indices[j] = rebuilt.labels[k], rebuilt.indices[k]
            if rebuilt.skipped and self.on_skipped is not None:
                self.on_skipped(rebuilt.skipped)
            holes += [places[k] for k in rebuilt.holes]
            skipped += rebuilt.skipped
            pixels = tuple(torch.cat([p, q]) for p, q in zip(pixels, each(rebuilt.images)))
            where = np.concatenate([where, places])
        if len(where):
            into = self._to_device(torch.from_numpy(where), at)
            for out, p in zip(outs, pixels):
                out.index_copy_(0, into, self._to_device(p, at).permute(0, 3, 1, 2))
        if holes:
            self._fill(outs, labels, indices, sorted(holes), skipped, at)
        views = tuple(out.permute(0, 2, 3, 1) for out in outs)  # NHWC views, contiguous
        return Staged(
            views if batch.multiview else views[0],
            self._to_device(labels, at),
            indices.clone() if at.indices else None,
            keep=[*keep, tensors, batch],
            fallbacks=len(refused),
        )

    def _fill(
        self,
        outs: list[torch.Tensor],
        labels: torch.Tensor,
        indices: torch.Tensor,
        holes: list[int],
        skipped: tuple[SkippedSample, ...],
        at: Placement,
    ) -> None:
        """A stream's failed records' rows (``holes``) filled from good rows of their batch
        (:func:`.refused.neighbour_rows`), in every view, their targets and indices too.

        Raises:
            SampleError: Every row of the batch is a hole.
        """
        sources = neighbour_rows(outs[0].shape[0], holes)
        if sources is None:
            first = skipped[0]
            raise SampleError(
                f"on_error='skip': every record of a batch failed (decode='gpu' fills a failed record's "
                f"row from a good one of its batch); first: {first}",
                first.index,
                first.where,
            )
        labels[holes], indices[holes] = labels[sources], indices[sources]
        into = self._to_device(torch.tensor(holes, dtype=torch.int64), at)
        taken = self._to_device(torch.tensor(sources, dtype=torch.int64), at)
        for rows in outs:
            rows.index_copy_(0, into, rows.index_select(0, taken))


def typical_size(batch: EncodedBatch) -> tuple[int, int]:
    """The median (height, width) of ``batch``'s encoded rows (nvdecode.SIZE_HINT if none)."""
    if not len(batch.rows):
        return SIZE_HINT
    height, width = np.median(batch.sizes[: len(batch.rows)], axis=0)
    return max(1, int(height)), max(1, int(width))


def _named(name: str) -> Callable[[int], str]:
    """Names every row a fall-back load fills (one row at a time): the sample it loaded."""
    return lambda _row: name
