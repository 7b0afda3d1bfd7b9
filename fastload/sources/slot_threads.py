"""A stream on the thread backend: each reading slot's batches made by a thread of this process.

The slots and their batches are the same as on worker processes (a thread plays worker i,
reading slot ``(i + start) % workers``: :meth:`fastload.sources.stream.SlotRecords.slot`), so a
pass resumes the same and its batches are the same; the consumer takes them in the order
DataLoader takes a worker's: one from each slot in turn, a slot that has ended left out.
Each thread keeps up to ``prefetch_factor`` batches ahead; an error in a slot's thread is
raised in the consumer, in its turn; close() (the closed event) ends the waits on both sides.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..batch import HostBatch
from ..datasets import waits
from .failures import CLOSED, interrupted, worker_failure
from .inflight import InFlight

WAIT_S = 0.1  # waits wake this often, so close() and the timeout are prompt
_END = object()  # a slot's last item


def _read(slot: Iterator[HostBatch], out: queue.Queue, stop: threading.Event, closed: threading.Event) -> None:
    """Puts ``slot``'s batches into ``out`` (then its error, or the end), until ``stop`` or ``closed``."""
    item: Any = _END
    with waits.bounded(0, closed):  # a wait of our own (the LMDB guard, a download) ends at close()
        try:
            for batch in slot:
                while not (stop.is_set() or closed.is_set()):
                    try:
                        out.put(batch, timeout=WAIT_S)
                        break
                    except queue.Full:
                        continue
                else:
                    batch.release()
                    return
        except BaseException as e:  # raised by the consumer, in this slot's turn
            item = e
    if not (stop.is_set() or closed.is_set()):
        out.put(item)


def slot_threads(
    data: Any, workers: int, prefetch_factor: int, timeout: float, inflight: InFlight, closed: threading.Event
) -> Iterator[HostBatch]:
    """The batches of ``data`` (a :class:`~fastload.sources.stream.SlotRecords`), its ``workers``
    slots each read by a thread, in DataLoader's order.

    Args:
        data: The pass.
        workers: Threads (each one slot).
        prefetch_factor: Batches each thread makes ahead.
        timeout: Seconds to wait for a batch (0: forever).
        inflight: Which record each thread is loading (thread i is row i), for timeout errors.
        closed: Set by close(): the pass ends.
    """
    stop = threading.Event()
    queues: list[queue.Queue] = [queue.Queue(maxsize=max(1, prefetch_factor)) for _ in range(workers)]
    threads = [
        threading.Thread(
            target=_read, args=(data.slot(w, workers), queues[w], stop, closed), name=f"fastload-slot-{w}", daemon=True
        )
        for w in range(workers)
    ]
    for t in threads:
        t.start()
    live = list(range(workers))
    try:
        while live:
            for w in list(live):
                item = _next(queues[w], timeout, closed, inflight)
                if item is _END:
                    live.remove(w)
                    continue
                if isinstance(item, BaseException):
                    if isinstance(item, waits.Interrupted):
                        raise interrupted(item) from None
                    raise item
                yield item
    finally:
        stop.set()  # the threads end at their next batch; their batches made ahead go back
        for q in queues:
            while True:
                try:
                    left = q.get_nowait()
                except queue.Empty:
                    break
                if isinstance(left, HostBatch):
                    left.release()


def _next(q: queue.Queue, timeout: float, closed: threading.Event, inflight: InFlight) -> Any:
    """The next item of a slot's queue, within ``timeout`` (0: forever), ended by close()."""
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        try:
            return q.get(timeout=WAIT_S)
        except queue.Empty:
            if closed.is_set():
                raise RuntimeError(CLOSED) from None
            if deadline is not None and time.monotonic() > deadline:
                raise worker_failure(
                    RuntimeError(f"thread backend timed out after {timeout} s"), inflight, None
                ) from None
