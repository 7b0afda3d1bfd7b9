"""The executor of host batches: copies each one to the driver's device.

On CUDA the copies are queued on the driver's side stream (``non_blocking`` from pinned
memory), between two timing events. The host buffer is released with the event recorded
right after its copy (also when a copy fails after another was queued), so a reused buffer
is rewritten only once the copy has read it. Pageable labels are pinned first (their copy
would otherwise wait for the side stream); inputs already on a GPU are read only after the
side stream waited for the stream that made them, and are ``record_stream``-ed on the side
stream. On the CPU nothing is copied: the driver releases the buffer once normalization has
copied the pixels out.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..batch import HostBatch
from ..views import batch_len, each, nbytes, to_device
from .staged import Placement, Staged

__all__ = ["HostCopy", "as_host_batch"]


def as_host_batch(item: Any) -> tuple[HostBatch, tuple]:
    """A HostBatch and the item's further fields: a HostBatch's are its ``extras`` (its samples'
    further fields, batched); a user's ``(images, labels, *extras)`` (e.g. ``(x, y, idx)``)
    keeps its extras, handed out as they are."""
    if isinstance(item, HostBatch):
        return item, item.extras
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise TypeError(
            f"CudaPrefetcher takes HostBatch or (uint8 images, labels, ...) items, got {type(item).__name__}"
        )
    images, labels = item[0], item[1]
    n = batch_len(images)
    return HostBatch(images, torch.as_tensor(labels), torch.full((n,), -1, dtype=torch.int64), -1), tuple(item[2:])


class HostCopy:
    """Stages HostBatches, or a user's (uint8 N×H×W×C images, labels, ...) tuples, by copying
    them to the device (see the module's docstring)."""

    threads: ClassVar[int] = 0  # the copies are queued without blocking

    def stage(self, item: HostBatch | tuple, at: Placement) -> Staged:
        batch, extras = as_host_batch(item)
        if at.stream is None:
            try:  # labels are copied: they may live in a reused buffer (tiny, so always)
                labels = batch.labels.to(at.device, copy=True)
                images = to_device(batch.images, at.device)
            except BaseException:
                batch.release()
                raise
            indices = batch.indices.clone() if at.indices else None
            return Staged(images, labels, indices, extras, lease=batch)
        return self._copy(batch, extras, at)

    def _copy(self, batch: HostBatch, extras: tuple, at: Placement) -> Staged:
        stream = at.stream
        images, labels = batch.images, batch.labels
        tensors = (*each(images), labels)  # every view of a multi-view batch, and the labels
        unpinned = not all(t.is_cuda or t.is_pinned() for t in each(images))
        # Inputs already on a GPU were written by their producer's current stream: the side
        # stream waits for that work, and the allocator keeps them until the side stream read them.
        producers = {t.device: torch.cuda.current_stream(t.device) for t in tensors if t.is_cuda}
        start, copied = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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
                    if t.is_cuda and t.device == at.device:  # (a copy from another GPU syncs itself)
                        t.record_stream(stream)
                start.record(stream)
                images = to_device(images, at.device, non_blocking=True)
                labels = labels.to(at.device, non_blocking=True)
                copied.record(stream)
                recorded = True
            indices = batch.indices.clone() if at.indices else None  # before the buffer goes back
        finally:
            # Also when a copy failed: the event is recorded after whatever was queued (one
            # never recorded counts as complete, and the buffer would be rewritten while a
            # queued copy still reads it).
            if not recorded:
                copied.record(stream)
            batch.release(copied)  # a reused host buffer is rewritten only after its copy read it
        return Staged(images, labels, indices, extras, timing=(start, copied, nbytes(batch.images)), unpinned=unpinned)
