"""The executor of ``decode="gpu"``: EncodedBatches → uint8 batches on the device, for the driver.

Each batch is decoded in one nvImageCodec call (regions where the worker planned them),
then every row is cut, resized (``interpolate(mode="bilinear", antialias=True)``) and
written into one buffer; flips, the rows decoded on the CPU and rounding are batch-wide;
the device driver normalizes and hands it over (:mod:`fastload.device.driver`). On CUDA
all of it is queued on a driver thread's own stream by that thread (the decoder call
blocks its thread, and a batch takes a few kernel launches per row), with no host
synchronization; what nvImageCodec and the workers own (decoded images, encoded bytes) is
the batch's ``keep``, dropped by the driver once the batch's event has passed. On the CPU
(the stand-in the tests run) the resize runs on uint8, the CPU path's kernel.

A row the decoder refuses is loaded by the CPU path in this process, as ``decode="cpu"``
would load it, under the loader's error policy: its error names the sample's file; a
replacement under ``on_error="skip"`` is reported like the workers'.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ...batch import SkippedSample
from ...sources.fetch import SampleLoader, put
from ...sources.packed import EncodedBatch
from ...targets import fill
from ..staged import Placement, Staged
from .nvdecode import SIZE_HINT, BatchDecoder

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
        resize_dtype: What the resize computes in: None for uint8 on the CPU (the CPU
            path's kernel) and float32 on CUDA (the CUDA kernel takes floats; rounded once).
        threads: Batches decoded at once on CUDA, each on a driver thread with its own
            decoder and stream (default: ``FASTLOAD_GPU_DECODE_THREADS``, else 2).
        decoder_threads: CPU threads for each nvImageCodec decoder; None: at most 4
            (nvdecode.default_threads).

    Raises:
        ValueError: ``threads`` is not an int >= 1.
    """

    def __init__(
        self,
        fallback: SampleLoader,
        on_skipped: Callable[[tuple[SkippedSample, ...]], None] | None = None,
        resize_dtype: torch.dtype | None = None,
        threads: int | None = None,
        decoder_threads: int | None = None,
    ) -> None:
        threads = decode_threads() if threads is None else threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        self.fallback = fallback
        self.on_skipped = on_skipped
        self.resize_dtype = resize_dtype
        # The decoder call blocks its thread: the driver runs ``threads`` batches at once, each
        # on its own thread and stream, with a decoder of that thread's own.
        self.threads = threads
        self.decoder_threads = decoder_threads
        self._local = threading.local()  # a thread's decoder, made on the device of its first batch
        self._fallback_lock = threading.Lock()  # the row loader keeps one in-flight row for this process

    def stage(self, batch: EncodedBatch, at: Placement) -> Staged:
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
        out_h, out_w = batch.out_size
        work = self.resize_dtype or (torch.uint8 if at.device.type == "cpu" else torch.float32)
        rows = torch.empty((n, 3, out_h, out_w), dtype=work, device=at.device, memory_format=torch.channels_last)
        tensors, keep = decoder.decode(batch, at.stream.cuda_stream if at.stream is not None else 0)
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
            flips = self._to_device(torch.tensor(flipped, dtype=torch.int64), at)
            rows.index_copy_(0, flips, rows.index_select(0, flips).flip(-1))
        if work is not torch.uint8:
            rows.round_().clamp_(0, 255)
        labels, indices = batch.labels, batch.indices
        pixels, where = batch.decoded, batch.decoded_rows
        if refused:
            labels, indices = labels.clone(), indices.clone()
            with self._fallback_lock:
                more = self._load_on_cpu(batch, refused, labels, indices)
            pixels, where = torch.cat([pixels, more]), np.concatenate([where, batch.rows[refused]])
        if len(where):
            host = self._to_device(pixels, at)
            rows.index_copy_(0, self._to_device(torch.from_numpy(where), at), host.permute(0, 3, 1, 2).to(work))
        images = rows.to(torch.uint8).permute(0, 2, 3, 1)  # an NHWC view, contiguous
        return Staged(
            images,
            self._to_device(labels, at),
            indices.clone() if at.indices else None,
            keep=[*keep, tensors, batch],
            fallbacks=len(refused),
        )

    def _load_on_cpu(
        self, batch: EncodedBatch, refused: list[int], labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """The refused encoded rows loaded by the CPU path (updating ``labels`` and
        ``indices`` where a row was replaced), as uint8 M×H×W×3."""
        out = torch.empty((len(refused), *batch.out_size, 3), dtype=torch.uint8)
        pixels = out.numpy()
        skipped: list[SkippedSample] = []
        consumer = len(self.fallback.inflight) - 1  # the in-flight row kept for this process
        for k, r in enumerate(refused):
            j, into = int(batch.rows[r]), pixels[k]
            item = self.fallback.load(int(batch.indices[j]), batch.epoch, consumer, into, seed=batch.seed)
            put(into, item, self.fallback)
            fill(labels[j : j + 1], [item.label], _named(self.fallback.samples.title_of(item.index)))
            indices[j] = item.index
            skipped.extend(item.skipped)
        if skipped and self.on_skipped is not None:
            self.on_skipped(tuple(skipped))
        return out


def typical_size(batch: EncodedBatch) -> tuple[int, int]:
    """The median (height, width) of ``batch``'s encoded rows (nvdecode.SIZE_HINT if none)."""
    if not len(batch.rows):
        return SIZE_HINT
    height, width = np.median(batch.sizes[: len(batch.rows)], axis=0)
    return max(1, int(height)), max(1, int(width))


def _named(name: str) -> Callable[[int], str]:
    """Names every row a fall-back load fills (one row at a time): the sample it loaded."""
    return lambda _row: name
