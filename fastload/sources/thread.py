"""Thread backend: decode threads write samples straight into reused (pinned) batch buffers.

PyTurboJPEG, OpenCV and Pillow release the GIL while decoding, so threads decode in
parallel with no shared-memory hop and no pin-memory copy. Each batch is made by the maker
every backend runs (:meth:`fastload.sources.maker.BatchMaker.make`, or the GPU's packing),
on a batch thread, with its per-row steps spread over the decode threads
(:class:`~fastload.sources.threadpool.ThreadRows`); the consumer takes the batches in order
from their futures. A ring buffer is reused only when its batch's rows have all ended (also
those of an abandoned pass), its consumer released it and its copy to the GPU is done.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, wait
from typing import Any

from ..datasets import waits
from ..encoded import SourceBatch
from .failures import PassClosed, interrupted, worker_failure
from .indexed import IndexedSource, Maker
from .pools import BufferPool, PlainPool
from .request import BatchRequest, PassRequest
from .ring import RingPool
from .sampler import ShardedBatchSampler
from .threadpool import ThreadRows, Workers
from .waiting import Stop, wait_until

JOIN_S = 2.0  # close() waits this long for threads stuck in a sample, then leaves them (daemons)
# The consumer waits this much past the timeout for a pass's first batch, so that a wait of our
# own in it (the LMDB guard's), bounded by the timeout in its thread, names what it waited for first.
HEAD_GRACE_S = 1.0
SHAPE_POLL_S = 0.002  # how often the start of a pass looks whether its first batch fixed the shape


class ThreadSource(IndexedSource):
    """Batches made by threads in this process.

    Args:
        maker: Makes the batches (its loader's in-flight table needs a row per decode thread
            and one for this process).
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

    def __init__(
        self,
        maker: Maker,
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
        if len(maker.loader.inflight) < num_threads + 1:
            raise ValueError("the in-flight table needs a row per thread plus one for the consumer")
        self.maker, self.sampler, self.inflight = maker, sampler, maker.loader.inflight
        self.prefetch, self.timeout = prefetch, timeout
        self._closed = threading.Event()
        # decoding ahead + held by the device stage + the batch handed over; decoding ahead is
        # capped at a pass's batches when a pass starts (a huge prefetch_factor allocates no more)
        self._held = device_ahead + 1
        count = min(prefetch, max(1, len(sampler))) + self._held
        self._ring = RingPool(count, sampler.batch_size, pin, pin_device, self._closed) if reuse else None
        self.pool: BufferPool = self._ring or PlainPool(pin, pin_device)
        self._consumer = num_threads  # the in-flight row of this process
        self._decode: Workers | None = Workers(num_threads, "fastload-decode", self._closed)
        # A batch thread per batch made at once: it plans the batch, leases its buffer and
        # waits for its rows; more than the decode threads can keep busy gains nothing.
        self._batches: Workers | None = Workers(max(1, min(prefetch, num_threads + 2)), "fastload-batch", self._closed)
        self._stop = Stop(self._closed)  # the current pass's

    @property
    def ring(self) -> Any:
        """The ring of reused buffers (None until the first batch, or without reuse)."""
        return self._ring.ring if self._ring is not None else None

    @property
    def copies(self) -> int:
        """Samples decoded beside their row and copied in."""
        return self.maker.copies

    def _submit(self, request: BatchRequest, stop: Stop) -> Future[SourceBatch]:
        if self._batches is None or self._decode is None:
            raise PassClosed()
        rows = ThreadRows(self._decode, stop, self.timeout)
        return self._batches.run(lambda: self.maker.make(request, self._consumer, self.pool, rows))

    def _timed_out(self) -> RuntimeError:
        return worker_failure(
            RuntimeError(f"thread backend timed out after {self.timeout} s"), self.inflight, self.dataset
        )

    def _deadline(self, grace: float = 0.0) -> float | None:
        return time.monotonic() + self.timeout + grace if self.timeout else None

    def _result(self, future: Future[SourceBatch], stop: Stop, deadline: float | None) -> SourceBatch:
        """The batch of ``future``: by ``deadline`` (None: whenever), ended by close()."""
        wait_until(lambda seconds: wait([future], seconds).done != set(), stop, deadline, self._timed_out)
        return future.result()

    def _shaped(self, first: Future[SourceBatch], epoch: int, stop: Stop, deadline: float | None) -> None:
        """Waits until the first batch of a pass has fixed the pass's sample shape (or ended),
        so that the batches made beside it are of its shape."""

        def ready(seconds: float) -> bool:
            if first.done() or self.maker.shaped(epoch):
                return True
            time.sleep(min(seconds, SHAPE_POLL_S))
            return False

        wait_until(ready, stop, deadline, self._timed_out)

    def batches(self, run: PassRequest) -> Iterator[SourceBatch]:
        """One pass: the requests of ``run`` (its epoch's, or the rest of it that it resumes)."""
        if self._batches is None:
            raise PassClosed()
        self._stop.cancelled = True  # a pass still running ends
        stop = self._stop = Stop(self._closed)
        self.maker.new_pass()
        # No more batches are made ahead than a pass has (the dataset may have grown since the last).
        ahead = min(self.prefetch, max(1, len(self.sampler)))
        self.pool.reset(ahead + self._held)
        requests = self.requests(run)
        pending: deque[Future[SourceBatch]] = deque()
        try:
            first = next(requests, None)
            if first is None:
                return
            pending.append(self._submit(first, stop))
            deadline = self._deadline(HEAD_GRACE_S)
            self._shaped(pending[0], first.epoch, stop, deadline)
            for request in requests:
                pending.append(self._submit(request, stop))
                if len(pending) >= ahead:
                    break
            while pending:
                batch = self._result(pending.popleft(), stop, deadline)
                following = next(requests, None)
                if following is not None:
                    pending.append(self._submit(following, stop))  # before the hand-over
                yield batch
                deadline = self._deadline()  # the timeout counts from the consumer's next wait
        except waits.Interrupted as e:  # a wait of our own ended early: closed, or past the timeout
            raise interrupted(e) from None
        finally:
            stop.cancelled = True  # rows not yet started end at once
            for future in pending:
                future.add_done_callback(_give_back)
            pending.clear()

    def restart(self) -> None:
        """Nothing to restart: a failed sample never takes a thread down."""

    def close(self) -> None:
        """Stops the threads; returns within a few seconds even if one is stuck in a sample."""
        decode, batches = self._decode, self._batches
        if decode is None or batches is None:
            return
        self._decode = self._batches = None
        self._closed.set()
        self._stop.cancelled = True
        batches.shutdown(JOIN_S)
        decode.shutdown(JOIN_S)
        self.pool.close()


def _give_back(future: Future) -> None:
    """The buffer of a batch made for a pass that ended before taking it, back to its pool."""
    if future.cancelled() or future.exception() is not None:
        return  # the maker gave it back
    future.result().release()
