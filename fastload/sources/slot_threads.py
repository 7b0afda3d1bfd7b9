"""A stream on the thread backend: each reading slot's batches made by a thread of this process.

The slots and their batches are the same as on worker processes (a thread plays worker i,
reading slot ``(i + start) % workers``: :meth:`fastload.sources.slots.SlotRecords.slot`), so a
pass resumes the same and its batches are the same; the consumer takes them in the order
DataLoader takes a worker's: one from each slot in turn, a slot that has ended left out.
Each thread keeps up to ``prefetch_factor`` batches ahead; an error in a slot's thread is
raised in the consumer, in its turn; close() (the closed event) ends the waits on both sides.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from ..batch import HostBatch
from ..datasets import waits
from ..encoded import EncodedBatch, SourceBatch
from .failures import interrupted, threads_timed_out
from .inflight import InFlight
from .waiting import WAIT_S, Stop, deadline, wait_until

_END = object()  # a slot's last item


def _put(out: queue.Queue, item: Any, stop: Stop) -> bool:
    """Puts ``item`` into ``out`` as soon as there is room; False when the pass stopped first."""
    while not stop.stopped:
        try:
            out.put(item, timeout=WAIT_S)
            return True
        except queue.Full:
            continue
    return False


def _read(slot: Iterator[SourceBatch], out: queue.Queue, stop: Stop) -> None:
    """Puts ``slot``'s batches into ``out`` (then its error, or the end), until the pass stops."""
    end: Any = _END
    with waits.bounded(0, stop.closed):  # a wait of our own (the LMDB guard, a download) ends at close()
        try:
            for batch in slot:
                if not _put(out, batch, stop):
                    batch.release()
                    return
        except BaseException as e:  # raised by the consumer, in this slot's turn
            end = e
    _put(out, end, stop)
    del end  # not held by this frame, which the error's traceback holds


def slot_threads(
    data: Any,
    workers: int,
    prefetch_factor: int,
    timeout: float,
    inflight: InFlight,
    closed: threading.Event,
    started: list[threading.Thread],
) -> Iterator[SourceBatch]:
    """The batches of ``data`` (a :class:`~fastload.sources.slots.SlotRecords`), its ``workers``
    slots each read by a thread, in DataLoader's order.

    Args:
        data: The pass.
        workers: Threads (each one slot).
        prefetch_factor: Batches each thread makes ahead.
        timeout: Seconds to wait for a batch (0: forever).
        inflight: Which record each thread is loading (thread i is row i), for timeout errors.
        closed: Set by close(): the pass ends.
        started: Where the threads are added as they start (close() joins them).
    """
    stop = Stop(closed)
    queues: list[queue.Queue] = [queue.Queue(maxsize=max(1, prefetch_factor)) for _ in range(workers)]
    threads = [
        threading.Thread(
            target=_read, args=(data.slot(w, workers), queues[w], stop), name=f"fastload-slot-{w}", daemon=True
        )
        for w in range(workers)
    ]
    for t in threads:
        t.start()
    started[:] = [t for t in started if t.is_alive()] + threads
    live = list(range(workers))
    try:
        while live:
            for w in list(live):
                item = _next(queues[w], timeout, stop, inflight)
                if item is _END:
                    live.remove(w)
                    continue
                if isinstance(item, BaseException):
                    # Not kept in this frame, which the error's traceback holds: that cycle kept
                    # the slot's reader (its open shard files, its threads) until gc ran.
                    error, item = item, None
                    try:
                        if isinstance(error, waits.Interrupted):
                            raise interrupted(error) from None
                        raise error
                    finally:
                        del error
                yield item
    finally:
        stop.cancelled = True  # the threads end at their next batch; their batches made ahead go back
        for q in queues:
            while True:
                try:
                    left = q.get_nowait()
                except queue.Empty:
                    break
                if isinstance(left, (HostBatch, EncodedBatch)):
                    left.release()


def _next(q: queue.Queue, timeout: float, stop: Stop, inflight: InFlight) -> Any:
    """The next item of a slot's queue, within ``timeout`` (0: forever), ended by close()."""
    box: list = []

    def ready(seconds: float) -> bool:
        try:
            box.append(q.get(timeout=seconds))
            return True
        except queue.Empty:
            return False

    wait_until(ready, stop, deadline(timeout), lambda: threads_timed_out(timeout, inflight, None))
    return box[0]
