"""Batch sources: where batches come from (worker processes, threads, a stream).

Every source implements :class:`BatchSource`, and :func:`build_source` picks one from the
dataset and the config, so the Loader never asks which kind it holds. The Loader owns the
epoch counter and passes each pass's epoch and seed in (:class:`PassRequest`); every batch
request carries them to the workers. The device driver consumes the batches: a
:class:`~fastload.HostBatch` of final pixels, or with ``decode="gpu"`` an
:class:`~fastload.encoded.EncodedBatch` for the device to decode (:data:`SourceBatch`).
"""

from __future__ import annotations

from ..encoded import SourceBatch
from .build import build_source, is_stream
from .fetch import SampleLoader
from .inflight import Busy, InFlight
from .process import ProcessSource
from .request import BatchRequest, PassRequest
from .source import BatchSource
from .stream import StreamSource
from .thread import ThreadSource
from .workers import WorkerOptions

__all__ = [
    "BatchRequest",
    "BatchSource",
    "Busy",
    "InFlight",
    "PassRequest",
    "ProcessSource",
    "SampleLoader",
    "SourceBatch",
    "StreamSource",
    "ThreadSource",
    "WorkerOptions",
    "build_source",
    "is_stream",
]
