"""Where a batch's rows are worked on: the one argument by which backends differ inside the builder.

The batch builder (:meth:`fastload.sources.maker.BatchMaker.make`, and the GPU's
:meth:`fastload.sources.packed.PackMaker.make`) does its per-row steps (plan a row, decode
the batch's regions, finish a row into its buffer) through a :class:`RowMap`:

- :class:`InTurn`: one after another in the calling thread (a worker process, or the main
  process with ``num_workers=0``).
- :class:`fastload.sources.threadpool.ThreadRows`: spread over the thread backend's decode
  threads, the builder's thread waiting for them.

A map also says when nothing it started still runs (:meth:`RowMap.finished`), which is
what a pool's buffer waits for before it is lent again (:class:`fastload.sources.pools.Writers`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

T = TypeVar("T")


class RowMap(Protocol):
    """Runs a batch's per-row steps."""

    def map(self, fn: Callable[[int, int], T], rows: Iterable[int]) -> list[T]:
        """``fn(j, worker)`` for each row ``j`` (``worker``: the in-flight row of the thread
        that runs it), the results in the order of ``rows``; an error stops the calls not yet
        started, and once no call runs the error of the row first in ``rows``' order among those
        that ran and failed is raised."""

    def finished(self) -> bool:
        """Nothing this map started still runs (its batch's buffer may be lent again)."""


class InTurn:
    """The rows one after another in the calling thread, as worker ``worker``.

    Args:
        worker: The in-flight row (and the pool's worker) of this thread.
    """

    def __init__(self, worker: int = 0) -> None:
        self.worker = worker

    def map(self, fn: Callable[[int, int], T], rows: Iterable[int]) -> list[T]:
        return [fn(j, self.worker) for j in rows]

    def finished(self) -> bool:
        return True


class Building:
    """What writes into a batch's buffer (:class:`fastload.sources.pools.Writers`): the builder,
    until it has returned, and the calls of its rows' map, until they have all ended. A buffer
    given back before (a pass ended, its buffers freed) is lent again only after both.

    Args:
        rows: The batch's row map.
    """

    def __init__(self, rows: RowMap) -> None:
        self.rows, self.done = rows, False

    def finished(self) -> bool:
        return self.done and self.rows.finished()


class Tally:
    """A count that rows on several threads add to (it travels to worker processes by value)."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n

    def __getstate__(self) -> int:
        return self.value

    def __setstate__(self, value: int) -> None:
        self.__init__(value)  # type: ignore[misc]
