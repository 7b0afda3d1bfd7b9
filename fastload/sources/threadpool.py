"""The thread backend's threads: daemon workers, a pass's stop signal, and rows spread over them.

:class:`Workers` are daemon threads that run submitted calls (they never hold up interpreter
exit, even with a call stuck in a sample); :meth:`Workers.run` gives a
:class:`concurrent.futures.Future` for a call's result. :class:`ThreadRows` is the
:class:`~fastload.sources.rowmap.RowMap` of one batch over the decode threads: the batch's
builder waits for its rows, and stops waiting (and its rows not yet started stop) once the
pass is cancelled or the source closed (:class:`Stop`).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

from ..datasets import waits
from .waiting import Stop, join_within, wait_until

T = TypeVar("T")


class Workers:
    """``count`` daemon threads running submitted calls, each given its thread's number.

    Args:
        count: Threads.
        name: Their name's prefix.
        closed: Ends the waits of fastload's own (the LMDB guard's) in a call once set.
    """

    def __init__(self, count: int, name: str, closed: threading.Event) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, args=(i, closed), name=f"{name}-{i}", daemon=True) for i in range(count)
        ]
        for t in self._threads:
            t.start()

    def __len__(self) -> int:
        return len(self._threads)

    def _work(self, worker: int, closed: threading.Event) -> None:
        with waits.bounded(0, closed):
            while True:
                call = self._calls.get()
                if call is None:
                    return
                call(worker)
                # An idle thread must not keep the call it ran (and the batch buffer the call
                # reaches) alive while it waits for the next one.
                del call

    def submit(self, call: Callable[[int], None]) -> None:
        """Runs ``call(worker)`` on one of the threads; it must not raise."""
        self._calls.put(call)

    def run(self, fn: Callable[[], T]) -> Future[T]:
        """``fn()`` on one of the threads, its result (or error) in the future returned."""
        future: Future[T] = Future()

        def call(worker: int) -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as e:  # re-raised by the consumer's result(), with its traceback
                future.set_exception(e)

        self.submit(call)
        return future

    def shutdown(self, wait_s: float) -> None:
        """Ends the threads once their calls are done, waiting for them up to ``wait_s`` seconds
        (a thread stuck in a sample is left: it is a daemon)."""
        for _ in self._threads:
            self._calls.put(None)
        join_within(self._threads, wait_s)


class ThreadRows:
    """One batch's rows over the decode threads (a :class:`~fastload.sources.rowmap.RowMap`).

    Args:
        threads: The decode threads (thread i loads as in-flight row i).
        stop: The pass's stop signal: a map stops waiting, and its calls not yet started do
            nothing, once it is set.
        timeout: Bounds the waits of fastload's own in each call (the Loader's ``timeout``; 0: none).
    """

    def __init__(self, threads: Workers, stop: Stop, timeout: float = 0.0) -> None:
        self._threads, self._stop, self._timeout = threads, stop, timeout
        self._running = 0
        self._lock = threading.Lock()

    def finished(self) -> bool:
        return self._running == 0

    def map(self, fn: Callable[[int, int], T], rows: Iterable[int]) -> list[T]:
        todo = list(rows)
        if not todo:
            return []
        results: list[Any] = [None] * len(todo)
        errors: dict[int, BaseException] = {}
        left = [len(todo)]
        done = threading.Event()
        stop, timeout = self._stop, self._timeout

        def call(k: int, j: int, worker: int) -> None:
            try:
                if not errors and not stop.stopped:
                    with waits.bounded(timeout, stop.closed):
                        results[k] = fn(j, worker)
            except BaseException as e:  # raised by map, in the builder's thread
                errors[k] = e
            finally:
                with self._lock:
                    left[0] -= 1
                    self._running -= 1
                    last = left[0] == 0
                if last:
                    done.set()

        with self._lock:
            self._running += len(todo)
        for k, j in enumerate(todo):
            self._threads.submit(functools.partial(call, k, j))
        wait_until(done.wait, stop)  # a call stuck in a sample keeps its row: the buffer waits for finished()
        # The failed row first in batch order among those that ran (a row not started after a
        # failure never runs), not the first to fail in time.
        if errors:
            raise errors[min(errors)]
        stop.check()  # rows left undone by a stop
        return results
