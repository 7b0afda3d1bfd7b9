"""The bounds of the pass a read runs for: waits of fastload's own end when it is closed or late.

A sample loaded in the training process itself (``num_workers=0``, the head of a thread
backend's batch, its decode threads) cannot be interrupted from outside, but the waits a
dataset makes on something of its own can end early: the LMDB guard's pipe is read in
short ticks, each of which checks the bounds the source set for this thread (the event
``close()`` sets, and the deadline of the Loader's ``timeout``). A wait that ends so raises
:class:`Interrupted`, which the source turns into its closed or timed-out error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

TICK_S = 0.1  # how often a wait looks at its bounds (a ready answer is read at once)


class Interrupted(BaseException):
    """A wait ended because its pass was closed or ran past the Loader's ``timeout``.

    A BaseException, as KeyboardInterrupt is: ``on_error="skip"`` (which catches Exception)
    must not take it for one sample's error and go on to the next.

    Attributes:
        closed: True when the pass was closed, False when it timed out.
    """

    def __init__(self, message: str, closed: bool) -> None:
        super().__init__(message)
        self.closed = closed


@dataclass(frozen=True)
class Bounds:
    """When waits of this thread must end: at ``deadline`` (monotonic; None: never), or once
    ``closed`` is set."""

    deadline: float | None
    timeout: float
    closed: threading.Event | None


class _Current(threading.local):
    bounds: Bounds | None = None


_current = _Current()


@contextmanager
def bounded(timeout: float, closed: threading.Event | None) -> Iterator[None]:
    """Bounds this thread's waits for the block: ``timeout`` seconds from now (0: none), and
    until ``closed`` is set."""
    previous = _current.bounds
    deadline = time.monotonic() + timeout if timeout else None
    _current.bounds = Bounds(deadline, timeout, closed)
    try:
        yield
    finally:
        _current.bounds = previous


def check(waiting_for: str) -> float | None:
    """Raises :class:`Interrupted` when this thread's pass is closed or past its deadline;
    else the seconds left before the deadline (None: no deadline).

    Args:
        waiting_for: What the wait is for, as the error names it ("the LMDB guard reading key ...").
    """
    bounds = _current.bounds
    if bounds is None:
        return None
    if bounds.closed is not None and bounds.closed.is_set():
        raise Interrupted(f"the Loader was closed while waiting for {waiting_for}", closed=True)
    if bounds.deadline is None:
        return None
    left = bounds.deadline - time.monotonic()
    if left <= 0:
        raise Interrupted(
            f"no batch within the Loader's timeout={bounds.timeout:g} s: still waiting for {waiting_for}",
            closed=False,
        )
    return left
