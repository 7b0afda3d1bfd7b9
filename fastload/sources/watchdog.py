"""Says what a stalled pipeline is stuck on: one warning per stall, naming the samples in flight."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from .fetch import in_flight
from .inflight import InFlight


class Watchdog:
    """Warns when the consumer has waited ``after`` seconds for one batch.

    The consumer brackets each wait with :meth:`waiting` / :meth:`arrived`; a daemon
    thread checks. It holds no reference to the Loader, so a dropped Loader is still
    collected (and closed) while the watchdog runs.

    Args:
        inflight: The workers' in-flight table.
        dataset: Names samples (``describe(index)``), or None.
        after: Seconds without a batch before warning; 0 disables the watchdog.
    """

    def __init__(self, inflight: InFlight, dataset: Any, after: float) -> None:
        self.inflight, self.dataset, self.after = inflight, dataset, after
        self._since: float | None = None
        self._warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def waiting(self) -> None:
        self._since, self._warned = time.monotonic(), False
        if self._thread is None and self.after > 0 and not self._stop.is_set():
            self._thread = threading.Thread(target=self._watch, name="fastload-watchdog", daemon=True)
            self._thread.start()

    def arrived(self) -> None:
        self._since = None

    def message(self, waited: float) -> str:
        busy, unwell = self.inflight.busy(), self.inflight.unwell()
        lines = [f"worker {b.worker} (pid {b.pid}) on {in_flight(b, self.dataset)} for {b.seconds:.0f} s" for b in busy]
        if not lines and not unwell:
            return (
                f"fastload: no batch for {waited:.0f} s and no sample is being loaded "
                "(workers starting, or blocked outside a sample?)"
            )
        where = f"; in flight: {'; '.join(lines)}" if lines else "; no sample is being loaded"
        return f"fastload: no batch for {waited:.0f} s{where}" + "".join(f"; {u}" for u in unwell)

    def _watch(self) -> None:
        tick = min(1.0, self.after / 4)
        while not self._stop.wait(tick):
            since = self._since
            if since is None or self._warned:
                continue
            waited = time.monotonic() - since
            if waited >= self.after:
                self._warned = True
                warnings.warn(self.message(waited), RuntimeWarning, stacklevel=1)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
