"""Both decoders at once: the share of ``decode="gpu"``'s rows the workers decode on the CPU.

With ``decode="gpu"`` the workers only read bytes and draw crops, and sit mostly idle while
the GPU decodes. ``Loader(gpu_cpu_share=s)`` has them decode a share ``s`` of each batch's
GPU-decodable rows themselves, by the CPU path (exactly as ``decode="cpu"`` would: the same
plan, the same draws, so those rows' pixels are ``decode="cpu"``'s), while the GPU decodes
the rest; the executor merges the two (:class:`GpuDecode` already places rows decoded in the
worker). Which rows: the first ``round(s * R)`` of the batch's R GPU-decodable rows, in
batch order (:func:`fastload.sources.packed.shared_rows`), so with a fixed ``s`` a batch's
content depends only on (seed, epoch, batch), never on timing.

The share travels in each batch request (``BatchRequest.cpu_share``), read when the request
is sent to a worker: a new share needs no new workers, and the batches already requested
keep theirs.

``"auto"`` (:class:`CpuShare`) sets the share from measured rates so that the two add up:
the workers' CPU rate is ``workers / t_cpu``, ``t_cpu`` the time a worker spends per row it
decodes for the share (each batch carries it, :attr:`EncodedBatch.cpu_seconds`); the GPU's
is ``threads / t_gpu``, ``threads`` the driver threads decoding batches at once (on CUDA;
one on the CPU) and ``t_gpu`` the executor's time per batch (host time of its call, and on
CUDA its stream's time between two events around its work, the larger) over the rows the
GPU decoded. Both times are smoothed over batches, and after each batch the share moves
half way toward ``rate_cpu / (rate_cpu + rate_gpu)``, clamped to [0, 0.95]; it starts at
0.5. Rows the GPU decoded and rows decoded in the workers for the share are counted
(``loader.stats()``: ``gpu_decoded_rows``, ``cpu_share_rows``, and the share now,
``gpu_cpu_share``).

The fixed point of that rule (within its bounds) is where the workers' time per batch on the
share equals the executor's, also where the executor has a fixed cost per batch (``t_gpu``,
measured at the share in use, holds it): it settles where
``s R t_cpu / workers = T_gpu(s) / threads``, ``T_gpu(s)`` the executor's time per batch.
The workers' other work (reading and planning every row, the rows the GPU cannot take) is
not counted as CPU time, so where it is large the share settles somewhat high.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Union

import torch

from ...encoded import EncodedBatch
from ..staged import Placement, Staged

__all__ = ["AUTO_MAX", "AUTO_START", "CpuShare", "ShareSetting", "SharedDecode"]

#: What ``Loader(gpu_cpu_share=...)`` takes: a share in [0, 1], "auto", or None (no share: 0).
ShareSetting = Union[float, str, None]

AUTO_START = 0.5  # the share "auto" starts from, before anything is measured
AUTO_MAX = 0.95  # the most "auto" hands to the workers: the GPU keeps at least 5% of the rows
SMOOTHING = 0.25  # the weight of each batch's measurement in the smoothed time per row
STEP = 0.5  # how far each batch moves the share toward its target


def _smoothed(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


class CpuShare:
    """The share of GPU-decodable rows the workers decode: fixed, or steered (``"auto"``).

    Args:
        setting: ``gpu_cpu_share``: a share in [0, 1], ``"auto"``, or None (0).
        workers: The workers making batches (0: this process makes them, counted as 1).
        gpu_threads: The executor's batches in progress at once (its driver threads on CUDA;
            the executor sets it, :class:`SharedDecode`).
    """

    def __init__(self, setting: ShareSetting, workers: int, gpu_threads: int = 1) -> None:
        self.auto = setting == "auto"
        self.share = AUTO_START if self.auto else float(setting or 0.0)  # type: ignore[arg-type]
        self.workers = max(1, int(workers))
        self.gpu_threads = max(1, int(gpu_threads))
        self.cpu_row_s: float | None = None  # a worker's smoothed time per shared row
        self.gpu_row_s: float | None = None  # the executor's smoothed time per GPU row
        self.cpu_rows = 0  # GPU-decodable rows the workers decoded (the share's)
        self.gpu_rows = 0  # rows the GPU decoded
        self._lock = threading.Lock()  # observed on the driver's threads (several at once), read by stats()

    def current(self) -> float:
        """The share for the next batch request."""
        return self.share

    def count(self, cpu_rows: int, gpu_rows: int) -> None:
        """Counts one batch's rows: decoded in the workers for the share, decoded by the GPU."""
        with self._lock:
            self.cpu_rows += cpu_rows
            self.gpu_rows += gpu_rows

    def observe_cpu(self, rows: int, seconds: float) -> None:
        """A worker spent ``seconds`` decoding ``rows`` rows for the share."""
        if rows > 0 and seconds > 0:
            with self._lock:
                self.cpu_row_s = _smoothed(self.cpu_row_s, seconds / rows)
                self._steer()

    def observe_gpu(self, rows: int, seconds: float) -> None:
        """The executor spent ``seconds`` on a batch of which the GPU decoded ``rows`` rows."""
        if rows > 0 and seconds > 0:
            with self._lock:
                self.gpu_row_s = _smoothed(self.gpu_row_s, seconds / rows)
                self._steer()

    def rates(self) -> tuple[float | None, float | None]:
        """(the workers' CPU rows/s, the GPU's rows/s), as measured so far (None: not yet)."""
        cpu = self.workers / self.cpu_row_s if self.cpu_row_s else None
        gpu = self.gpu_threads / self.gpu_row_s if self.gpu_row_s else None
        return cpu, gpu

    def target(self) -> float | None:
        """``rate_cpu / (rate_cpu + rate_gpu)``, clamped to [0, AUTO_MAX]; None before both are measured."""
        cpu, gpu = self.rates()
        if cpu is None or gpu is None:
            return None
        return min(max(cpu / (cpu + gpu), 0.0), AUTO_MAX)

    def _steer(self) -> None:
        """``"auto"``: the share moved toward the target (it stays in the target's bounds); a fixed share stays."""
        target = self.target() if self.auto else None
        if target is not None:
            self.share += STEP * (target - self.share)

    def as_dict(self) -> dict:
        """What ``loader.stats()`` shows of it."""
        with self._lock:
            out: dict[str, Any] = {
                "gpu_cpu_share": self.share,
                "cpu_share_rows": self.cpu_rows,
                "gpu_decoded_rows": self.gpu_rows,
            }
        cpu, gpu = self.rates()
        out.update(cpu_share_rows_per_s=cpu, gpu_rows_per_s=gpu)
        return out


class SharedDecode:
    """The GPU decode executor, its rows counted and its time per batch measured; called from
    as many driver threads at once as the executor it runs.

    Args:
        inner: The executor (:class:`~fastload.device.gpudecode.GpuDecode`).
        share: Hears of each batch: its rows, the workers' time, the executor's time.
    """

    def __init__(self, inner: Any, share: CpuShare) -> None:
        self.inner, self.share = inner, share
        # (start, end, rows, host seconds) of batches whose work on their stream may not have run yet.
        self._pending: list[tuple[Any, Any, int, float]] = []
        self._lock = threading.Lock()

    @property
    def threads(self) -> int:
        """The inner executor's driver threads."""
        return int(self.inner.threads)

    def stage(self, batch: EncodedBatch, at: Placement) -> Staged:
        """The inner executor's :meth:`stage` of ``batch``, its rows counted and its time measured."""
        self._collect()
        timed = at.stream is not None
        # The batches in progress at once: one per driver thread on CUDA, one at a time on the CPU.
        self.share.gpu_threads = max(1, self.threads) if timed else 1
        if timed:
            start = torch.cuda.Event(enable_timing=True)
            start.record(at.stream)
        began = time.perf_counter()
        staged = self.inner.stage(batch, at)
        host = time.perf_counter() - began
        rows = len(batch.rows) - staged.fallbacks
        self.share.count(batch.cpu_share_rows, rows)
        self.share.observe_cpu(batch.cpu_share_rows, batch.cpu_seconds)
        if timed:
            end = torch.cuda.Event(enable_timing=True)
            end.record(at.stream)
            with self._lock:
                self._pending.append((start, end, rows, host))
        else:
            self.share.observe_gpu(rows, host)
        return staged

    def _collect(self) -> None:
        """The GPU times of the batches whose work has run (only passed events are read: no wait)."""
        done: list[tuple[Any, Any, int, float]] = []
        with self._lock:
            waiting: list[tuple[Any, Any, int, float]] = []
            for p in self._pending:  # several streams' batches: each one's own end event
                (done if p[1].query() else waiting).append(p)
            self._pending = waiting
        for start, end, rows, host in done:
            self.share.observe_gpu(rows, max(host, start.elapsed_time(end) / 1000))
