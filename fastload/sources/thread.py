"""Thread backend: decode threads write samples straight into reused (pinned) batch buffers.

PyTurboJPEG, OpenCV and Pillow release the GIL while decoding, so threads decode in
parallel with no shared-memory hop and no pin-memory copy. Each batch is a job run by the
same :class:`~fastload.sources.maker.BatchMaker` as the process backend's, its steps spread
over the threads: a task per row plans it (where the executor plans ahead), the last of
them decodes the batch's regions in one call, then a task per row finishes it into its
buffer row. A ring buffer is reused only when its job has finished (also a job of an
abandoned pass), its consumer released it and its copy to the GPU is done.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from ..batch import HostBatch
from ..datasets import waits
from ..views import numpy_rows, row
from .batchplan import BatchPlan
from .failures import CLOSED, interrupted, worker_failure
from .fetch import Loaded, put
from .indexed import IndexedSource
from .maker import BatchMaker
from .pools import BatchBuffers, BufferPool, PlainPool
from .request import BatchRequest, PassRequest
from .ring import RingPool
from .sampler import ShardedBatchSampler

JOIN_S = 2.0  # close() waits this long for threads stuck in a sample, then leaves them (daemons)
WAIT_S = 0.1  # result waits wake this often so Ctrl-C and timeouts are prompt
# The consumer waits this much past the timeout for a pass's head, so that a wait of our own
# in it (the LMDB guard's), bounded by the timeout in its thread, names what it waited for first.
HEAD_GRACE_S = 1.0


class _Job:
    """One batch being made: a planning task per row (where the rows are planned ahead), then a
    finishing task per row; results in order, first error kept.

    Args:
        plan: The batch's plan.
        maker: Plans and loads its rows.
        first: Rows already loaded (the head of a pass, by the consumer).
        planned: Its rows are planned (and the batch decoded) already, or need not be.
    """

    def __init__(self, plan: BatchPlan, maker: BatchMaker, first: int, planned: bool) -> None:
        self.plan, self.maker, self.first = plan, maker, first
        self.buffers: BatchBuffers | None = None
        self.rows: Any = None  # the batch's numpy rows (a tuple of them per view)
        self.loaded: list[Loaded | None] = [None] * len(plan)
        self.error: BaseException | None = None
        self.cancelled = False
        self.copies = 0
        self._to_plan = 0 if planned else len(plan) - first
        self._left = len(plan) - first
        self.on_done: Any = None  # called once its last task has ended (a waiting lease looks again)
        self._lock = threading.Lock()
        self._done = threading.Event()
        if self._left == 0:
            self._done.set()

    @property
    def request(self) -> BatchRequest:
        return self.plan.request

    def finished(self) -> bool:
        return self._done.is_set()

    def tasks(self) -> list[tuple[_Job, str, int]]:
        """The tasks to submit now: the planning ones, else the finishing ones."""
        kind = "plan" if self._to_plan else "load"
        return [(self, kind, j) for j in range(self.first, len(self.plan))]

    def run(self, kind: str, j: int, worker: int) -> list[tuple[_Job, str, int]]:
        """Runs one task; returns the tasks it makes due (the last planning task: the loads)."""
        return self._plan(j, worker) if kind == "plan" else self._load(j, worker)

    def _plan(self, j: int, worker: int) -> list[tuple[_Job, str, int]]:
        try:
            if not self.cancelled and self.error is None:
                self.maker.plan_row(self.plan, j, worker)
        except BaseException as e:  # re-raised in the consumer, with its traceback
            self.error = self.error or e
        with self._lock:
            self._to_plan -= 1
            last = self._to_plan == 0
        if not last:
            return []
        try:
            if not self.cancelled and self.error is None:
                self.maker.decode_batch(self.plan, worker)
        except BaseException as e:
            self.error = self.error or e
        if self.cancelled or self.error is not None:
            self._ended(self._left)  # nothing more will run: its buffer may be lent again
            return []
        return self.tasks()

    def _load(self, j: int, worker: int) -> list[tuple[_Job, str, int]]:
        copies = 0
        try:
            if not self.cancelled and self.error is None and self.loaded[j] is None:
                into = row(self.rows, j)
                item = self.maker.load_row(self.plan, j, worker, into)
                copies = put(into, item, self.maker.loader)
                self.loaded[j] = item
        except BaseException as e:  # re-raised in the consumer, with its traceback
            self.error = self.error or e
        finally:
            self._ended(1, copies)
        return []

    def _ended(self, tasks: int, copies: int = 0) -> None:
        with self._lock:
            self.copies += copies
            self._left -= tasks
            last = self._left == 0
        if last:
            self._done.set()
            if self.on_done is not None:
                self.on_done()

    def wait(self, timeout: float, on_timeout, closed: threading.Event) -> None:
        _wait(self._done, timeout, on_timeout, closed)
        if self.error is not None:
            raise self.error
        if self.cancelled or any(item is None for item in self.loaded):
            raise RuntimeError(
                "a batch of this pass was cancelled: a newer pass of the same source started "
                "(iterate a Loader from one thread at a time)"
            )

    def cancel(self) -> None:
        """Stops its tasks that have not started and gives its buffer back (reused only once
        the tasks already running have ended)."""
        self.cancelled = True
        buffers, self.buffers = self.buffers, None
        if buffers is not None and buffers.lease is not None:
            buffers.lease.release()


def _wait(done: threading.Event, timeout: float, on_timeout, closed: threading.Event) -> None:
    """Waits for ``done``: up to ``timeout`` s (0: forever), waking often so Ctrl-C and close() are prompt."""
    deadline = time.monotonic() + timeout if timeout else None
    while not done.wait(WAIT_S):
        if closed.is_set():
            raise RuntimeError(CLOSED)
        if deadline is not None and time.monotonic() > deadline:
            raise on_timeout()


class _Head:
    """The first batch of a pass planned and its head loaded (the rows that fix the sample
    shape) by a decode thread, so that the consumer waits for it as for any batch: within the
    timeout, and Ctrl-C or close() end the wait even if a sample never returns."""

    def __init__(self, request: BatchRequest, maker: BatchMaker, timeout: float, closed: threading.Event) -> None:
        self.request, self.maker, self.timeout, self.closed = request, maker, timeout, closed
        self.plan: BatchPlan | None = None
        self.head: list[Loaded] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self, kind: str, j: int, worker: int) -> list:
        try:
            with waits.bounded(self.timeout, self.closed):  # our own waits end in time
                self.plan = self.maker.plan(self.request, worker)
                self.head = self.maker.head(self.plan, worker)
        except BaseException as e:  # re-raised in the consumer, with its traceback
            self.error = e
        finally:
            self._done.set()
        return []

    def wait(self, on_timeout) -> tuple[BatchPlan, list[Loaded]]:
        _wait(self._done, self.timeout + HEAD_GRACE_S if self.timeout else 0, on_timeout, self.closed)
        if self.error is not None:
            raise self.error
        assert self.plan is not None
        return self.plan, self.head


class _Pool:
    """Daemon threads running (job, task, row) tasks; never blocks interpreter exit."""

    def __init__(self, threads: int, closed: threading.Event) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, args=(i, closed), name=f"fastload-decode-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _work(self, worker: int, closed: threading.Event) -> None:
        with waits.bounded(0, closed):  # a sample's wait of our own (the LMDB guard) ends at close()
            while True:
                task = self._tasks.get()
                if task is None:
                    return
                job, kind, j = task
                self.submit(job.run(kind, j, worker))
                # An idle thread must not keep the job it ran (and its batch buffer) alive while it
                # waits for the next task: the consumer may long be done with that batch.
                del task, job

    def submit(self, tasks: list) -> None:
        for task in tasks:
            self._tasks.put(task)

    def shutdown(self, wait_s: float) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


class ThreadSource(IndexedSource):
    """HostBatches made by a pool of threads in this process.

    Args:
        maker: Makes the batches (its loader's in-flight table needs a row per thread and one
            for the consumer).
        sampler: This rank's requests per epoch.
        num_threads: Decoding threads.
        prefetch: Batches being made ahead of the consumer.
        pin: Pin the buffers (for CUDA).
        reuse: Reuse buffers (a ring); off when the consumer keeps views of the uint8 batch.
        timeout: Seconds to wait for a batch (0: forever).
        device_ahead: Batches the consumer's device stage holds beyond the one handed out
            (their buffers come back once their copies are done).
        pin_device: The CUDA device buffers are pinned for (see :func:`fastload.collate.pinning_on`).
    """

    maker: BatchMaker  # its steps run as separate tasks here

    def __init__(
        self,
        maker: BatchMaker,
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
        if len(maker.inflight) < num_threads + 1:
            raise ValueError("the in-flight table needs a row per thread plus one for the consumer")
        self.maker, self.sampler, self.inflight = maker, sampler, maker.inflight
        self.prefetch, self.timeout = prefetch, timeout
        self._closed = threading.Event()
        # decoding ahead + held by the device stage + the batch handed over; decoding ahead is
        # capped at a pass's batches when a pass starts (a huge prefetch_factor allocates no more)
        self._held = device_ahead + 1
        count = min(prefetch, max(1, len(sampler))) + self._held
        self.pool: BufferPool = (
            RingPool(count, sampler.batch_size, pin, pin_device, self._closed) if reuse else PlainPool(pin, pin_device)
        )
        self.copies = 0  # samples decoded beside their row and copied in
        self._consumer = num_threads  # the in-flight row of the consumer thread
        self._threads: _Pool | None = _Pool(num_threads, self._closed)
        self._pending: deque[_Job] = deque()  # the current pass's jobs, in order

    @property
    def ring(self) -> Any:
        """The ring of reused buffers (None until the first batch, or without reuse)."""
        return self.pool.ring if isinstance(self.pool, RingPool) else None

    def _start(self, request: BatchRequest, first_of_pass: bool) -> _Job:
        """Leases the batch's buffer and submits its tasks."""
        if self._threads is None:
            raise RuntimeError(CLOSED)
        maker = self.maker
        head: list[Loaded] = []
        if first_of_pass:
            # The head of a pass fixes the shape (a transform may have changed between passes):
            # planned and loaded beside the buffer, as a worker process makes a batch (by a
            # decode thread: a sample that never returns is a timeout, not a hang); the rest in place.
            first = _Head(request, maker, self.timeout, self._closed)
            self._threads.submit([(first, "head", 0)])
            plan, head = first.wait(self._timed_out)
            job = _Job(plan, maker, len(head), planned=True)
        else:
            plan = maker.plan(request, ahead=False)
            job = _Job(plan, maker, 0, planned=not maker.executor.plans)
        job.buffers = maker.lease(plan, head, self.pool, self._consumer, until=job)
        if isinstance(self.pool, RingPool) and self.pool.ring is not None:
            job.on_done = self.pool.ring.writers_finished
        job.rows = numpy_rows(job.buffers.images)
        for j, item in enumerate(head):
            self.copies += put(row(job.rows, j), item, maker.loader)
            job.loaded[j] = item
        self._threads.submit(job.tasks())
        return job

    def _timed_out(self) -> RuntimeError:
        return worker_failure(
            RuntimeError(f"thread backend timed out after {self.timeout} s"), self.inflight, self.dataset
        )

    def _finish(self, job: _Job) -> HostBatch:
        job.wait(self.timeout, self._timed_out, self._closed)
        self.copies += job.copies
        buffers, job.buffers = job.buffers, None
        if buffers is None:  # cancelled since it was started
            raise RuntimeError(CLOSED)
        loaded = [item for item in job.loaded if item is not None]
        return self.maker.collate(buffers, loaded, job.request)

    def batches(self, run: PassRequest) -> Iterator[HostBatch]:
        """One pass: the requests of ``run`` (its epoch's, or the rest of it that it resumes)."""
        if self._threads is None:
            raise RuntimeError(CLOSED)
        self._cancel()
        self.maker.new_pass()
        # No more batches are made ahead than a pass has (the dataset may have grown since the last).
        ahead = min(self.prefetch, max(1, len(self.sampler)))
        if isinstance(self.pool, RingPool):
            self.pool.release_all()
            self.pool.count = ahead + self._held
        requests = self.requests(run)
        pending = self._pending = deque()
        try:
            for request in requests:
                pending.append(self._start(request, first_of_pass=not pending))
                if len(pending) >= ahead:
                    break
            while pending:
                job = pending.popleft()
                try:
                    batch = self._finish(job)
                except BaseException:
                    job.cancel()
                    raise
                following = next(requests, None)
                if following is not None:
                    pending.append(self._start(following, first_of_pass=False))  # before the hand-over
                yield batch
        except waits.Interrupted as e:  # a wait of our own ended early: closed, or past the timeout
            raise interrupted(e) from None
        finally:
            for job in pending:
                job.cancel()  # its tasks end at once; its buffer waits for those running
            pending.clear()

    def _cancel(self) -> None:
        for job in self._pending:
            job.cancel()
        self._pending.clear()

    def restart(self) -> None:
        """Nothing to restart: a failed sample never takes a thread down."""

    def close(self) -> None:
        """Stops the threads; returns within a few seconds even if one is stuck in a sample."""
        threads, self._threads = self._threads, None
        if threads is None:
            return
        self._closed.set()
        self._cancel()
        threads.shutdown(JOIN_S)
