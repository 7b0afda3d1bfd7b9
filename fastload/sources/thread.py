"""Thread backend: decode threads write samples straight into reused (pinned) batch buffers.

PyTurboJPEG, OpenCV and Pillow release the GIL while decoding, so threads decode in
parallel with no shared-memory hop and no pin-memory copy. Each batch is a job of one
task per sample; a ring slot is reused only when its job has finished (also a job of an
abandoned pass), its consumer released it and its copy to the GPU is done.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batch import HostBatch
from ..collate import batch_buffer, pinning_on
from ..datasets import waits
from ..targets import TargetSpec
from ..views import SampleShape, batch_shape, from_numpy, map_images, numpy_rows, row, shape_of
from .failures import CLOSED, interrupted, worker_failure
from .fetch import BatchFetcher, Loaded, collated, put
from .indexed import IndexedSource
from .ring import BufferRing, RingLease
from .sampler import BatchRequest, ShardedBatchSampler

if TYPE_CHECKING:
    from .resume import Plan

JOIN_S = 2.0  # close() waits this long for threads stuck in a sample, then leaves them (daemons)
WAIT_S = 0.1  # result waits wake this often so Ctrl-C and timeouts are prompt


class _Job:
    """One batch being decoded: a task per sample, results in order, first error kept.

    ``lease`` is the ring slot the rows live in (None for a one-off buffer).
    """

    def __init__(self, request: BatchRequest, ring: BufferRing | None) -> None:
        self.request, self.ring = request, ring
        self.rows: Any = np.empty(0, np.uint8)  # the batch's numpy rows (a tuple of them per view)
        self.buffers: Any = None  # the ring slot's SlotBuffers, or None for a one-off buffer
        self.lease: RingLease | None = None
        self.loaded: list[Loaded | None] = [None] * len(request.indices)
        self.error: BaseException | None = None
        self.cancelled = False
        self.copies = 0
        self._left = len(request.indices)
        self._lock = threading.Lock()
        self._done = threading.Event()

    def finished(self) -> bool:
        return self._done.is_set()

    def run(self, j: int, fetcher: BatchFetcher, worker: int) -> None:
        copies = 0
        try:
            if not self.cancelled and self.error is None and self.loaded[j] is None:
                slot = row(self.rows, j)
                item = fetcher.load(int(self.request.indices[j]), self.request.epoch, worker, slot)
                copies = put(slot, item, fetcher.dataset)
                self.loaded[j] = item
        except BaseException as e:  # re-raised in the consumer, with its traceback
            if self.error is None:
                self.error = e
        finally:
            with self._lock:
                self.copies += copies
                self._left -= 1
                last = self._left == 0
            if last:
                self._done.set()
                if self.ring is not None:
                    self.ring.writers_finished()

    def wait(self, timeout: float, on_timeout, closed: threading.Event) -> None:
        deadline = time.monotonic() + timeout if timeout else None
        while not self._done.wait(WAIT_S):
            if closed.is_set():
                raise RuntimeError(CLOSED)
            if deadline is not None and time.monotonic() > deadline:
                raise on_timeout()
        if self.error is not None:
            raise self.error
        if self.cancelled or any(item is None for item in self.loaded):
            raise RuntimeError(
                "a batch of this pass was cancelled: a newer pass of the same source started "
                "(iterate a Loader from one thread at a time)"
            )

    def cancel(self) -> None:
        """Stops its tasks that have not started and gives its slot back (reused only once
        the tasks already running have ended)."""
        self.cancelled = True
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()


class _Pool:
    """Daemon threads running (job, sample) tasks; never blocks interpreter exit."""

    def __init__(self, fetcher: BatchFetcher, threads: int, closed: threading.Event) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, args=(fetcher, i, closed), name=f"fastload-decode-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _work(self, fetcher: BatchFetcher, worker: int, closed: threading.Event) -> None:
        with waits.bounded(0, closed):  # a sample's wait of our own (the LMDB guard) ends at close()
            while True:
                task = self._tasks.get()
                if task is None:
                    return
                job, j = task
                job.run(j, fetcher, worker)
                # An idle thread must not keep the job it ran (and its batch buffer) alive while it
                # waits for the next task: the consumer may long be done with that batch.
                del task, job

    def submit(self, job: _Job, first: int = 0) -> None:
        for j in range(first, len(job.loaded)):
            self._tasks.put((job, j))

    def shutdown(self, wait_s: float) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


class ThreadSource(IndexedSource):
    """HostBatches decoded by a pool of threads in this process.

    Args:
        fetcher: Loads samples with the error policy.
        sampler: This rank's requests per epoch.
        num_threads: Decoding threads.
        prefetch: Batches being decoded ahead of the consumer.
        pin: Pin the ring buffers (for CUDA).
        reuse: Reuse buffers; off when the consumer keeps views of the uint8 batch.
        timeout: Seconds to wait for a batch (0: forever).
        device_ahead: Batches the consumer's device stage holds beyond the one handed out
            (their buffers come back once their copies are done).
    """

    def __init__(
        self,
        fetcher: BatchFetcher,
        sampler: ShardedBatchSampler,
        num_threads: int,
        prefetch: int,
        *,
        pin: bool,
        reuse: bool = True,
        timeout: float = 0.0,
        device_ahead: int = 2,
        pin_device: Any = None,
    ) -> None:
        if num_threads < 1:
            raise ValueError(f"the thread backend needs num_workers >= 1, got {num_threads}")
        if len(fetcher.inflight) < num_threads + 1:
            raise ValueError("the in-flight table needs a row per thread plus one for the consumer")
        self.fetcher, self.sampler, self.inflight = fetcher, sampler, fetcher.inflight
        self.prefetch, self.pin, self.reuse, self.timeout = prefetch, pin, reuse, timeout
        self.device_ahead = device_ahead
        self.pin_device = pin_device  # the CUDA device buffers are pinned for (see pinning_on)
        self.ring: BufferRing | None = None
        self.copies = 0  # samples decoded beside their slot and copied in
        self._consumer = num_threads  # the in-flight row of the consumer thread
        self._closed = threading.Event()
        self._pool: _Pool | None = _Pool(fetcher, num_threads, self._closed)
        self._pending: deque[_Job] = deque()  # the current pass's jobs, in order
        self._shape: SampleShape | None = None  # of one sample, learnt at each pass's start

    def _ring_slots(self) -> int:
        # decoding ahead + held by the device stage + the batch handed over
        return self.prefetch + self.device_ahead + 1

    def _start(self, request: BatchRequest, first_of_pass: bool) -> _Job:
        """Allocates the batch's rows and submits its samples."""
        if self._pool is None:
            raise RuntimeError(CLOSED)
        n = len(request.indices)
        head: list[Loaded] = []
        if first_of_pass or self._shape is None:
            # The head of a pass fixes the shape (a transform may have changed between passes):
            # load it here, then write the rest in place.
            with waits.bounded(self.timeout, self._closed):  # loaded in this thread: our own waits end in time
                head = self.fetcher.head(request, self._consumer)
            self._shape = shape_of(head[0].image)
            target = TargetSpec.of(head[0].label)
            shape = batch_shape(self.sampler.batch_size, self._shape)
            if self.reuse and (self.ring is None or self.ring.shape != shape or self.ring.target != target):
                with pinning_on(self.pin_device if self.pin else None):
                    self.ring = BufferRing(self._ring_slots(), shape, self.pin, target)
        job = _Job(request, self.ring if self.reuse else None)
        if self.ring is not None and self.reuse:
            slot = self.ring.acquire(job, self._closed)
            job.buffers = self.ring.buffers(slot)
            job.rows = numpy_rows(map_images(lambda t: t[:n], job.buffers.images))
            job.lease = RingLease(self.ring, slot)
        else:
            with pinning_on(self.pin_device if self.pin else None):
                job.rows = numpy_rows(batch_buffer(n, self._shape, pin=self.pin))
        for j, item in enumerate(head):
            self.copies += put(row(job.rows, j), item, self.fetcher.dataset)
            job.loaded[j] = item
            job.run(j, self.fetcher, self._consumer)  # counts the task done (already loaded)
        self._pool.submit(job, len(head))
        return job

    def _finish(self, job: _Job) -> HostBatch:
        def timed_out() -> RuntimeError:
            return worker_failure(
                RuntimeError(f"thread backend timed out after {self.timeout} s"),
                self.fetcher.inflight,
                self.fetcher.dataset,
            )

        job.wait(self.timeout, timed_out, self._closed)
        self.copies += job.copies
        loaded = [item for item in job.loaded if item is not None]
        images = from_numpy(job.rows) if job.buffers is None else job.buffers.images
        labels = indices = None
        if job.buffers is not None:
            labels, indices = job.buffers.labels, job.buffers.indices
        batch = collated(images, loaded, job.request.epoch, labels, indices, self.fetcher.dataset)
        batch.lease, job.lease = job.lease, None
        return batch

    def batches(self, epoch: int, plan: Plan | None = None) -> Iterator[HostBatch]:
        """One pass: the sampler's requests of ``epoch``, or the rest of it that ``plan`` says."""
        if self._pool is None:
            raise RuntimeError(CLOSED)
        self._cancel()
        self.fetcher.new_pass()
        if self.ring is not None:
            self.ring.release_all()
        explicit = self.requests(epoch, plan)
        requests = self.sampler.requests(epoch) if explicit is None else iter(explicit)
        pending = self._pending = deque()
        try:
            for request in requests:
                pending.append(self._start(request, first_of_pass=not pending))
                if len(pending) >= self.prefetch:
                    break
            while pending:
                job = pending.popleft()
                try:
                    batch = self._finish(job)
                except BaseException:
                    job.cancel()
                    raise
                request = next(requests, None)
                if request is not None:
                    pending.append(self._start(request, first_of_pass=False))  # before the hand-over
                yield batch
        except waits.Interrupted as e:  # a wait of our own ended early: closed, or past the timeout
            raise interrupted(e) from None
        finally:
            for job in pending:
                job.cancel()  # its tasks end at once; its slot waits for those running
            pending.clear()

    def _cancel(self) -> None:
        for job in self._pending:
            job.cancel()
        self._pending.clear()

    def restart(self) -> None:
        """Nothing to restart: a failed sample never takes a thread down."""

    def close(self) -> None:
        """Stops the threads; returns within a few seconds even if one is stuck in a sample."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        self._closed.set()
        self._cancel()
        pool.shutdown(JOIN_S)
