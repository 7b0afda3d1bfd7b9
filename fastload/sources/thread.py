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

import functools
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from typing import Any

from ..datasets import waits
from ..encoded import SourceBatch
from .failures import PassClosed, WorkerFailure, interrupted, threads_timed_out
from .indexed import IndexedSource, Maker
from .pools import BufferPool, PlainPool
from .request import BatchRequest, PassRequest
from .ring import RingPool
from .sampler import ShardedBatchSampler
from .threadpool import ThreadRows, Workers
from .waiting import JOIN_S, Stop, deadline, wait_until

# Past the timeout, for a pass's first batch: a wait of our own in it (the LMDB guard's) names what it waited for.
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
        super().__init__(maker, sampler)
        self.prefetch, self.timeout = prefetch, timeout
        # decoding ahead + held by the device stage + the batch handed over; decoding ahead is
        # capped at a pass's batches when a pass starts (a huge prefetch_factor allocates no more)
        self._held = device_ahead + 1
        count = min(prefetch, max(1, len(sampler))) + self._held
        self._ring_args = (count, sampler.batch_size, pin, pin_device) if reuse else None
        self._ring = self._new_ring()
        self.pool: BufferPool = self._ring or PlainPool(pin, pin_device)
        self._consumer = num_threads  # the in-flight row of this process
        self._threads = (num_threads, max(1, min(prefetch, num_threads + 2)))
        self._new_threads()
        self._stop = Stop(self._closed)  # the current pass's

    def _new_ring(self) -> RingPool | None:
        # A method, not a closure: one over self would hold this source in a reference cycle.
        return RingPool(*self._ring_args, self._closed) if self._ring_args is not None else None

    def _new_threads(self) -> None:
        self._decode = Workers(self._threads[0], "fastload-decode", self._closed)
        # A batch thread per batch made at once: it plans the batch, leases its buffer and
        # waits for its rows; more than the decode threads can keep busy gains nothing.
        self._batches = Workers(self._threads[1], "fastload-batch", self._closed)

    def _replace_threads(self) -> None:
        """After a pass timed out: the next pass gets new threads, and a new ring of buffers. A
        thread stuck in a sample cannot be stopped: it is left (a daemon), with the buffer its
        batch holds, and the others end (before, each timeout left one more thread stuck, and
        once every decode thread was, every later pass got nothing)."""
        old = (self._batches, self._decode)
        self._new_threads()
        for threads in old:
            threads.shutdown(0)
        ring = self._new_ring()
        if ring is not None:
            self._ring = self.pool = ring

    @property
    def ring(self) -> Any:
        """The ring of reused buffers (None until the first batch, or without reuse)."""
        return self._ring.ring if self._ring is not None else None

    def _submit(self, request: BatchRequest, stop: Stop) -> Future[SourceBatch]:
        if stop.closed.is_set():
            raise PassClosed()
        rows = ThreadRows(self._decode, stop, self.timeout)
        return self._batches.run(lambda: self.maker.make(request, self._consumer, self.pool, rows))

    def _wait(self, ready: Callable[[float], bool], stop: Stop, by: float | None) -> None:
        try:
            wait_until(ready, stop, by, lambda: threads_timed_out(self.timeout, self.inflight, self.dataset))
        except WorkerFailure:  # past the timeout: the threads may be stuck in a sample
            stop.cancelled = True
            self._replace_threads()
            raise

    def batches(self, run: PassRequest) -> Iterator[SourceBatch]:
        """One pass: the requests of ``run`` (its epoch's, or the rest of it that it resumes)."""
        Stop(self._closed).check()  # closed: no pass
        self._stop.cancelled = True  # a pass still running ends
        stop = self._stop = Stop(self._closed)
        self.maker.new_pass()
        # No more batches are made ahead than a pass has (the dataset may have grown since the last).
        ahead = min(self.prefetch, max(1, len(self.sampler)))
        self.pool.reset(ahead + self._held)
        requests = self.requests(run)
        pending: deque[Future[SourceBatch]] = deque()
        try:
            if (first := next(requests, None)) is None:
                return
            pending.append(self._submit(first, stop))
            by = deadline(self.timeout, HEAD_GRACE_S)
            # The batches made beside the first are of its shape: they start once its head has fixed it.
            self._wait(lambda s: self.maker.shaped(first.epoch) or _done(pending[0], min(s, SHAPE_POLL_S)), stop, by)
            pending.extend(self._submit(r, stop) for r in itertools.islice(requests, ahead - 1))
            while pending:
                future = pending.popleft()
                self._wait(functools.partial(_done, future), stop, by)
                following = next(requests, None)
                if following is not None:
                    pending.append(self._submit(following, stop))  # before the hand-over
                yield future.result()
                by = deadline(self.timeout)  # the timeout counts from the consumer's next wait
        except waits.Interrupted as e:  # a wait of our own ended early: closed, or past the timeout
            raise interrupted(e) from None
        finally:
            stop.cancelled = True  # rows not yet started end at once
            for future in pending:
                future.add_done_callback(_give_back)
            pending.clear()

    def _end_workers(self) -> None:
        """Stops the threads: within a few seconds even if one is stuck in a sample (a daemon, left)."""
        for threads in (self._batches, self._decode):
            threads.shutdown(JOIN_S)


def _done(future: Future, seconds: float) -> bool:
    """Whether ``future`` is done, waiting up to ``seconds`` for it."""
    return bool(wait([future], seconds).done)


def _give_back(future: Future) -> None:
    """The buffer of a batch made for a pass that ended before taking it, back to its pool."""
    if not future.cancelled() and future.exception() is None:  # else the maker gave it back
        future.result().release()
