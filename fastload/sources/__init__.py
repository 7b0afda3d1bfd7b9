"""Batch sources: where HostBatches come from (worker processes, threads, a stream).

Each source implements :class:`BatchSource`; the Loader owns the epoch counter and
passes the epoch in, and the device stage consumes the HostBatches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from ..batch import HostBatch
from .fetch import BatchFetcher
from .inflight import Busy, InFlight
from .process import ProcessSource, WorkerOptions
from .stream import StreamSource
from .thread import ThreadSource


class BatchSource(Protocol):
    """Yields one epoch's HostBatches; ``close`` stops its workers (idempotent).

    The map-style sources (process, thread) also take ``requests``: an explicit list of
    batches for one pass (a resumed epoch's); the stream source takes ``start``, the
    number of this rank's batches to leave out (see :mod:`fastload.resume`).
    """

    def batches(self, epoch: int) -> Iterator[HostBatch]: ...

    def close(self) -> None: ...


__all__ = [
    "BatchFetcher",
    "BatchSource",
    "Busy",
    "InFlight",
    "ProcessSource",
    "StreamSource",
    "ThreadSource",
    "WorkerOptions",
]
