"""How every runner waits, written once: :func:`wait_until`, ended by a pass's :class:`Stop`.

A runner waits for one thing at a time: a batch's future (threads), a slot's queue (streams
on threads), DataLoader's next item (worker processes and ``num_workers=0``), a free buffer
of the ring. Each is a ``ready(seconds)`` that waits up to that long and says whether it
came; :func:`wait_until` calls it until it does, raising the pass's stop (``close()`` from
any thread, or a newer pass) before each call and, where the wait has a deadline (the
Loader's ``timeout``), the timeout error once a call ends past it. So close ends a pass on
threads or on worker processes within one wait (:data:`WAIT_S`, or DataLoader's tick), and
their timeouts are told the same way. With ``num_workers=0`` a call loads a whole batch in
this process and has no deadline: the timeout and close end fastload's own waits inside
a sample (:func:`fastload.datasets.waits.bounded`), not a decode or the dataset's ``load``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from .failures import PassClosed

WAIT_S = 0.1  # waits wake this often, so close(), cancel and Ctrl-C are prompt
JOIN_S = 2.0  # close() waits this long for threads stuck in a sample, then leaves them (daemons)
CANCELLED = (
    "a batch of this pass was cancelled: a newer pass of the same source started "
    "(iterate a Loader from one thread at a time)"
)


class Stop:
    """Ends a pass's work: set by a newer pass (cancelled) or by close() (``closed``).

    Args:
        closed: The source's closed event (None: one that is never set).
    """

    def __init__(self, closed: threading.Event | None = None) -> None:
        self.closed = closed if closed is not None else threading.Event()
        self.cancelled = False

    @property
    def stopped(self) -> bool:
        return self.cancelled or self.closed.is_set()

    def check(self) -> None:
        """Raises the error of a stopped pass (closed, or cancelled by a newer one)."""
        if self.closed.is_set():
            raise PassClosed()
        if self.cancelled:
            raise RuntimeError(CANCELLED)


def deadline(timeout: float, grace: float = 0.0, start: float | None = None) -> float | None:
    """The deadline (monotonic) of a wait that began at ``start`` (default: now) under the
    Loader's ``timeout`` (0: none, and None back), ``grace`` seconds later."""
    if not timeout:
        return None
    return (time.monotonic() if start is None else start) + timeout + grace


def wait_until(
    ready: Callable[[float], bool],
    stop: Stop,
    deadline: float | None = None,
    timed_out: Callable[[], BaseException] | None = None,
) -> None:
    """Waits until ``ready(WAIT_S)`` (which waits up to that long) is true.

    ``stop`` is looked at before each call: a stopped pass raises its error (the closed
    error, :class:`~fastload.sources.failures.PassClosed`, or the cancelled one) and takes
    nothing more. Once ``deadline`` (monotonic; None: never) has passed, ``timed_out()`` is
    raised (a TimeoutError without it).
    """
    while True:
        stop.check()
        if ready(WAIT_S):
            return
        if deadline is not None and time.monotonic() > deadline:
            raise timed_out() if timed_out is not None else TimeoutError("past the deadline")


def join_within(threads: Iterable[threading.Thread], wait_s: float) -> None:
    """Joins ``threads``, all of them within ``wait_s`` seconds in all (one stuck in a sample is
    left: fastload's threads are daemons)."""
    deadline = time.monotonic() + wait_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
