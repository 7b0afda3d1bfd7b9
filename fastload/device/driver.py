"""The device driver: batches from a source → normalized N×C×H×W (channels_last) batches on the device.

One loop for every kind of batch. An executor puts one batch's uint8 N×H×W×C pixels on the
device (:class:`~fastload.device.copy.HostCopy` copies a host batch; GPU decode decodes an
encoded one, :mod:`fastload.device.gpudecode`); the driver normalizes them, keeps ``depth``
batches in flight, hands each over (through the Loader's batch transforms) and times the
consumer's waits.

On CUDA each batch's work is queued on the driver's side stream, made at the first pass on
the device of that pass. Each batch gets its own ``ready`` event, recorded after its
normalization: the consumer stream waits for that batch only (not for everything queued on
the side stream, which would make ``depth`` > 1 useless), and every handed-over tensor is
``record_stream``-ed on the consumer so the caching allocator never reuses its memory while
the step still reads it. What an executor's queued work reads outside torch's allocator
(its ``keep``) is dropped only once the batch's event has passed. An executor whose work
blocks its thread (the GPU decoder's call) runs on the driver's own threads
(``executor.threads`` of them), each with its own side stream, one batch on each at a time,
handed over in the source's order: the training thread then only waits for each batch's
event. On the CPU the same numbers and layout are produced synchronously.
``tests/cudasim`` proves this ordering without a GPU (docs/guides/gpu.md).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from ..config import resolve_device
from ..views import Images, each, same_memory
from .normalize import Normalizer
from .staged import Executor, Placement, Staged

__all__ = ["CLOSE_WAIT_S", "DeviceDriver", "Executor", "Placement", "Staged", "Stats"]

CLOSE_WAIT_S = 2.0  # close() waits this long for the batch its thread is on (a CPU fall-back may hang)

#: What the driver hands out: (images, labels[, indices], *extras); images a list, one per view,
#: for a multi-view batch.
Output = tuple


class Stats:
    """Counters the driver keeps; :meth:`as_dict` is what ``loader.stats()`` returns.

    ``wait_s`` is the time the consumer spent inside ``next()`` waiting for a batch;
    ``total_s`` runs from the first request of a pass to its last hand-over, so it holds
    the consumer's own steps too and ``wait_share`` is the share of time spent waiting.
    ``fallbacks`` counts the rows an executor left to the CPU path (GPU decode's refusals).
    """

    def __init__(self) -> None:
        self.batches = 0
        self.wait_s = 0.0
        self.total_s = 0.0
        self.h2d_bytes = 0
        self.h2d_s = 0.0
        self.unpinned = 0
        self.fallbacks = 0

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "wait_s": self.wait_s,
            "wait_share": self.wait_s / self.total_s if self.total_s else 0.0,
            "wait_ms_per_batch": 1000 * self.wait_s / self.batches if self.batches else 0.0,
            "h2d_gbps": self.h2d_bytes / self.h2d_s / 1e9 if self.h2d_s else None,
            "unpinned_batches": self.unpinned,
            "cpu_fallback_rows": self.fallbacks,
        }


@dataclass
class _Queued:
    """A batch whose work is queued on the side stream."""

    images: Images | list[torch.Tensor]  # a list: one per view
    labels: torch.Tensor
    indices: torch.Tensor | None
    extras: tuple
    ready: Any  # CUDA event after its normalization; None on the CPU

    def outputs(self) -> Output:
        return (self.images, self.labels) + ((self.indices,) if self.indices is not None else ()) + self.extras


@dataclass
class _InFlight:
    """What the driver holds for a batch until its ``ready`` event has passed."""

    ready: Any
    keep: list
    timing: tuple[Any, Any, int] | None


class DeviceDriver:
    """Stages, normalizes and hands over the batches of a source on ``device``.

    Args:
        executor: Puts each batch on the device (e.g. :class:`~fastload.device.copy.HostCopy`).
        device: Target device; None means cuda if available, else cpu.
        depth: Batches in flight on the side stream.
        normalizer: Applied to each staged batch (default: ImageNet float32).
        indices: Also hand out each batch's int64 sample indices (a CPU copy).
        stream: The CUDA side stream to use (default: a new one, made at the first pass); an
            executor that runs on the driver's threads queues on each thread's own stream.
        stats: Counters to add to (default: new ones; the Loader keeps its own across drivers).

    Raises:
        ValueError: ``depth`` is not an int >= 1, or a stream was given for a device that is not CUDA.
    """

    def __init__(
        self,
        executor: Executor,
        device: Any = None,
        depth: int = 2,
        normalizer: Normalizer | Callable[[Any], Any] | None = None,
        indices: bool = False,
        stream: Any = None,
        stats: Stats | None = None,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        self.executor = executor
        self.device = resolve_device(device)
        self.depth = depth
        self.normalizer = normalizer or Normalizer()
        self.indices = indices
        self.stats = stats if stats is not None else Stats()
        if stream is not None and self.device.type != "cuda":
            raise ValueError(f"a CUDA stream was given for device {self.device}")
        self._stream = stream  # made at the first pass (a device change is a new driver)
        self._inflight: deque[_InFlight] = deque()  # batches queued on the streams
        self._threads: ThreadPoolExecutor | None = None  # a threaded executor's (CUDA)
        self._submitted: deque[Future] = deque()  # batches given to those threads, not yet known done
        self._local = threading.local()  # a driver thread's own side stream
        self._side: list[Any] = []  # every driver thread's stream, for close()
        self._count_lock = threading.Lock()  # stats are counted from several threads
        self._warned_unpinned = False
        self._closed = False

    def run(self, iterable: Iterable, finish: Callable[[Output], Output] | None = None) -> Iterator[Output]:
        """Delivers the batches of ``iterable`` (one pass), timing the consumer's waits.

        Args:
            iterable: What the executor takes (host batches, encoded batches).
            finish: Applied to each output as it is handed over, on the consumer's stream
                (the Loader's batch transforms); not counted as waiting.
        """
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        source = iter(iterable)
        outputs = self._cuda(source) if self.device.type == "cuda" else self._cpu(source)
        try:
            asked = since = time.perf_counter()
            for out in outputs:
                # The wait: from the consumer's request (the end of its step) to the hand-over.
                now = time.perf_counter()
                self.stats.wait_s += now - asked
                self.stats.total_s += now - since
                self.stats.batches += 1
                since = now
                yield out if finish is None else finish(out)
                asked = time.perf_counter()
        finally:
            outputs.close()

    def _placement(self, stream: Any = None) -> Placement:
        return Placement(self.device, stream, self.indices)

    def _thread_stream(self) -> Any:
        """The side stream of the driver thread this runs on, made at its first batch: threads
        decode concurrently, and work on one stream would run one batch after another."""
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
            with self._count_lock:
                self._side.append(stream)
        return stream

    def _cpu(self, source: Iterator) -> Generator[Output, None, None]:
        at = self._placement(None)
        for item in source:
            staged = self.executor.stage(item, at)
            self._count(staged)
            try:
                images = self.normalizer(staged.images)
            except BaseException:
                if staged.lease is not None:
                    staged.lease.release()
                raise
            if staged.lease is not None and not same_memory(images, staged.images):
                staged.lease.release()  # normalization copied the pixels: the buffer can be rewritten
            yield _Queued(images, staged.labels, staged.indices, staged.extras, None).outputs()

    def _cuda(self, source: Iterator) -> Generator[Output, None, None]:
        queued: deque[Future | _Queued] = deque()  # a Future where the executor runs on a thread
        # ``depth`` batches queued before one is handed over (at least one per driver thread),
        # the next one queued before the consumer's step.
        ahead = max(self.depth, self.executor.threads)
        failed: list[Exception] = []
        try:
            while True:
                while len(queued) < ahead:
                    item = _pull(source, failed)
                    if item is None:
                        break
                    queued.append(self._submit(item))
                if not queued:
                    if failed:
                        raise failed.pop()
                    return
                head = queued.popleft()
                batch = head.result() if isinstance(head, Future) else head
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_event(batch.ready)  # this batch only, not all the stream's work
                for view in each(batch.images):
                    view.record_stream(consumer)  # not reused while the consumer's step reads it
                batch.labels.record_stream(consumer)
                nxt = _pull(source, failed)  # start the next batch before the consumer's step
                if nxt is not None:
                    queued.append(self._submit(nxt))
                self._drop_finished()
                yield batch.outputs()
        finally:
            for pending in queued:  # an abandoned pass: what has not started never will
                if isinstance(pending, Future):
                    pending.cancel()

    def _submit(self, item: Any) -> Future | _Queued:
        if self.executor.threads < 1:
            return self._queue(item, self._stream)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.executor.threads, thread_name_prefix="fastload-device")
        while self._submitted and self._submitted[0].done():
            self._submitted.popleft()
        future = self._threads.submit(lambda: self._queue(item, self._thread_stream()))
        self._submitted.append(future)
        return future

    def _queue(self, item: Any, stream: Any) -> _Queued:
        """Stages ``item`` and queues its normalization and ``ready`` event on ``stream``."""
        staged = self.executor.stage(item, self._placement(stream))
        self._count(staged)
        ready = torch.cuda.Event()
        with torch.cuda.stream(stream):
            try:
                images = self.normalizer(staged.images)
            finally:
                # Also after a failed normalization: what was queued still reads ``keep``.
                ready.record(stream)
                self._inflight.append(_InFlight(ready, staged.keep, staged.timing))
        return _Queued(images, staged.labels, staged.indices, staged.extras, ready)

    def _count(self, staged: Staged) -> None:
        with self._count_lock:
            self.stats.fallbacks += staged.fallbacks
            self.stats.unpinned += int(staged.unpinned)
            warn = staged.unpinned and not self._warned_unpinned
            self._warned_unpinned |= staged.unpinned
        if warn:
            warnings.warn(
                "fastload: a batch arrived in unpinned memory, so its host-to-device "
                "copy cannot overlap compute; pin it (Loader(pin_memory=True))",
                RuntimeWarning,
                stacklevel=6,
            )

    def _drop_finished(self) -> None:
        # Only passed events are read, so this never blocks the host. With several driver
        # threads, batches are appended as they are staged, not in order: one whose event has
        # passed may wait behind one that has not, which only keeps it a little longer.
        while self._inflight and self._inflight[0].ready.query():
            done = self._inflight.popleft()
            if done.timing is not None:
                start, end, size = done.timing
                self.stats.h2d_s += start.elapsed_time(end) / 1000
                self.stats.h2d_bytes += size

    def close(self) -> None:
        """Waits for the stream's pending work and drops what it held; idempotent."""
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
            # The batches they are on are queued on their streams before the waits below, unless
            # a fall-back load is stuck in a sample. Not only the last ones submitted: those may be
            # cancelled (a pass broken off), and wait() never sees a future the shutdown dropped finish.
            running = [f for f in self._submitted if not f.cancelled()]
            self._submitted.clear()
            wait(running, timeout=CLOSE_WAIT_S)
        if not self._closed:
            with self._count_lock:
                streams = [*self._side, *([self._stream] if self._stream is not None else [])]
            for stream in streams:
                stream.synchronize()
        self._closed = True
        self._inflight.clear()

    def __enter__(self) -> DeviceDriver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _pull(source: Iterator, failed: list[Exception]) -> Any:
    """The next item of ``source``, or None at its end or at its error, which goes into ``failed``:
    raised once the batches queued before it are handed over, so an error comes in its batch's
    turn (as DataLoader's) and the batches before it are not lost."""
    if failed:
        return None  # the source ended with its error
    try:
        return next(source, None)
    except Exception as e:
        failed.append(e)
        return None
