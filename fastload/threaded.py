"""Thread backend: samples decoded straight into slots of reused (pinned) batch buffers.

PyTurboJPEG, OpenCV and Pillow release the GIL while decoding, so threads decode in
parallel with no per-sample allocation, no shared-memory hop from a worker process and
no pin-memory copy. A buffer is rewritten only after its consumer let it go: for CUDA,
once the event recorded after its host-to-device copy has completed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .collate import alloc_batch, check_image
from .fetch import BatchFetcher, Skipped
from .sampler import BatchRequest

_END = object()
POLL_S = 0.05


class Lease:
    """A ring buffer handed to the consumer; :meth:`release` lets the ring reuse it."""

    def __init__(self, ring: BufferRing, slot: int) -> None:
        self._ring, self._slot = ring, slot

    def release(self, event: Any = None) -> None:
        """Frees the buffer now, or once ``event`` (a CUDA event after its copy) completes."""
        self._ring.release(self._slot, event)


class BufferRing:
    """``count`` uint8 batch buffers allocated once from the first batch's shape."""

    def __init__(self, count: int, pin: bool) -> None:
        self.count, self.pin = count, pin
        self.buffers: list[torch.Tensor] = []
        self._busy = [False] * count
        self._events: list[Any] = [None] * count
        self._cond = threading.Condition()

    def allocate(self, shape: tuple[int, ...]) -> None:
        if not self.buffers:
            self.buffers = [alloc_batch(shape, pin=self.pin) for _ in range(self.count)]

    def acquire(self, stop: threading.Event) -> int:
        with self._cond:
            while not stop.is_set():
                for i in range(self.count):
                    if not self._busy[i] and (self._events[i] is None or self._events[i].query()):
                        self._busy[i], self._events[i] = True, None
                        return i
                self._cond.wait(POLL_S)  # events cannot notify: poll them
        raise _Stopped

    def release(self, slot: int, event: Any = None) -> None:
        with self._cond:
            self._busy[slot], self._events[slot] = False, event
            self._cond.notify()

    def reset(self) -> None:
        """Frees buffers an abandoned pass never released; pending copy events still gate them."""
        with self._cond:
            self._busy = [False] * self.count
            self._cond.notify_all()


class _Stopped(Exception):
    pass


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class ThreadBatches:
    """Iterable of (uint8 N×H×W×C, labels, skipped, lease) built by a thread pool.

    Args:
        fetcher: Loads samples with the dataset's error policy.
        sampler: Yields BatchRequests (same sampler as the process backend).
        num_threads: Decoding threads.
        prefetch: Batches decoded ahead of the consumer.
        pin: Pin the ring buffers (for CUDA).
        timeout: Seconds to wait for a batch (0: forever).
        reuse: Reuse buffers; off when the consumer may keep the uint8 batch itself.
    """

    def __init__(self, fetcher: BatchFetcher, sampler: Any, num_threads: int, prefetch: int, *, pin: bool,
                 timeout: float = 0.0, reuse: bool = True) -> None:
        if num_threads < 1:
            raise ValueError(f"the thread backend needs num_workers >= 1, got {num_threads}")
        self.fetcher, self.sampler, self.prefetch, self.timeout = fetcher, sampler, prefetch, timeout
        self.reuse = reuse
        self.ring = BufferRing(prefetch + 3, pin)  # decoding ahead + queued + the consumer's + one in copy
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="fastload-decode")
        self._run: tuple[threading.Thread, threading.Event] | None = None
        self.bytes_written = 0  # into batch buffers: each sample's pixels once
        self.extra_copies = 0  # samples decoded elsewhere and copied into their slot
        self._closed = False

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, Skipped, Lease | None]]:
        if self._closed:
            raise RuntimeError("thread backend is closed")
        self._stop_run()
        self.ring.reset()
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        coordinator = threading.Thread(target=self._produce, args=(list(self.sampler), out, stop),
                                       name="fastload-batches", daemon=True)
        self._run = (coordinator, stop)
        coordinator.start()
        try:
            while True:
                item = self._get(out)
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            stop.set()

    def _get(self, out: queue.Queue) -> Any:
        deadline = time.monotonic() + self.timeout if self.timeout else None
        while True:  # short waits keep Ctrl-C prompt
            try:
                return out.get(timeout=POLL_S)
            except queue.Empty:
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"thread backend timed out after {self.timeout} s") from None

    def _fill(self, buf: np.ndarray | None, j: int, index: int, epoch: int) -> tuple[Any, int, Skipped, int]:
        """Loads one sample into slot ``j``; returns (image, label, skipped, extra copies)."""
        skipped: Skipped = []
        slot = buf[j] if buf is not None else None
        img, label = self.fetcher.load(index, epoch, skipped, slot)
        if slot is None or img is slot:
            return img, label, skipped, 0
        if img.shape != slot.shape or img.dtype != np.uint8:
            check_image(img, f"sample {index}")
            raise ValueError(f"sample {index} has shape {img.shape} but the batch holds {slot.shape}; "
                             "use a transform with a fixed output size")
        slot[...] = img
        return img, label, skipped, 1

    def _submit(self, request: BatchRequest, stop: threading.Event) -> tuple:
        if self.ring.buffers or not self.reuse:
            slot = self.ring.acquire(stop) if self.reuse else None
            buf = self.ring.buffers[slot][: len(request.indices)] if slot is not None else None
        else:
            slot, buf = None, None  # first batch: learn the shape, then allocate the ring
        np_buf = buf.numpy() if buf is not None else None
        futures = [self._pool.submit(self._fill, np_buf, j, int(i), request.epoch)
                   for j, i in enumerate(request.indices)]
        return request, slot, buf, futures

    def _finish(self, request: BatchRequest, slot: int | None, buf: torch.Tensor | None,
                futures: list[Future]) -> tuple:
        results = [f.result() for f in futures]  # re-raises a sample's error with its traceback
        skipped: Skipped = [s for _, _, sk, _ in results for s in sk]
        labels = torch.tensor([label for _, label, _, _ in results], dtype=torch.int64)
        self.extra_copies += sum(copies for _, _, _, copies in results)
        if buf is None:
            shape = (len(results), *results[0][0].shape)
            for j, (img, _, _, _) in enumerate(results):
                if img.shape != results[0][0].shape:
                    check_image(img, f"sample {int(request.indices[j])}")
                    raise ValueError(f"sample {int(request.indices[j])} has shape {img.shape} but sample "
                                     f"{int(request.indices[0])} has {results[0][0].shape}")
            if self.reuse:
                self.ring.allocate((self.sampler.batch_size, *shape[1:]))
                slot = self.ring.acquire(threading.Event())
                buf = self.ring.buffers[slot][: shape[0]]
            else:
                buf = alloc_batch(shape, pin=self.ring.pin)
            dst = buf.numpy()
            for j, (img, _, _, _) in enumerate(results):
                dst[j] = img
            self.extra_copies += len(results)
        self.bytes_written += buf.numel()
        lease = Lease(self.ring, slot) if slot is not None else None
        return buf, labels, skipped, lease

    def _produce(self, requests: list[BatchRequest], out: queue.Queue, stop: threading.Event) -> None:
        inflight: deque = deque()
        try:
            for request in requests:
                if stop.is_set():
                    return
                if not self.ring.buffers and inflight:  # shape still unknown: finish the first batch
                    out.put(self._finish(*inflight.popleft()))
                inflight.append(self._submit(request, stop))
                while len(inflight) > self.prefetch:
                    out.put(self._finish(*inflight.popleft()))
            while inflight and not stop.is_set():
                out.put(self._finish(*inflight.popleft()))
            out.put(_END)
        except _Stopped:
            pass
        except BaseException as e:
            out.put(_Failure(e))
        finally:
            for _, _, _, futures in inflight:
                for f in futures:
                    f.cancel()

    def _stop_run(self) -> None:
        if self._run is not None:
            thread, stop = self._run
            stop.set()
            thread.join()
            self._run = None

    def close(self) -> None:
        """Stops the batch thread and joins the decoding threads; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_run()
        self._pool.shutdown(wait=True, cancel_futures=True)
