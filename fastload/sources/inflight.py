"""Which sample each worker is loading, readable from the main process.

Workers (processes or threads) mark a row of a small shared-memory table before each
sample and clear it after. The watchdog reads it to say what a stalled pipeline is stuck
on, and worker-death errors read it to name the sample that was being loaded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from ..system import process_state

_PID, _INDEX, _EPOCH, _START = range(4)
IDLE = -1


@dataclass(frozen=True)
class Busy:
    """One worker's sample in flight."""

    worker: int
    pid: int
    index: int
    epoch: int
    seconds: float


class InFlight:
    """A row per worker: (pid, sample index or -1, epoch, start time in monotonic ns)."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        table = torch.full((workers, 4), IDLE, dtype=torch.int64)
        table.share_memory_()  # before any numpy view: see storage.py
        self._table = table
        self._rows = table.numpy()

    def __getstate__(self) -> torch.Tensor:
        return self._table

    def __setstate__(self, table: torch.Tensor) -> None:
        self._table, self._rows = table, table.numpy()

    def __len__(self) -> int:
        return len(self._rows)

    def register(self, worker: int) -> None:
        """Records the calling process as ``worker`` before it loads anything."""
        row = self._rows[worker % len(self._rows)]
        row[_INDEX] = IDLE
        row[_PID] = os.getpid()

    def pids(self) -> dict[int, int]:
        """worker → pid of the processes that registered or loaded a sample, other than this one."""
        me = os.getpid()
        return {w: int(r[_PID]) for w, r in enumerate(self._rows.copy()) if r[_PID] not in (IDLE, me)}

    def unwell(self) -> list[str]:
        """ "worker N (pid P) is stopped" for each worker process that is stopped or dead."""
        states = ((w, pid, process_state(pid)) for w, pid in self.pids().items())
        return [
            f"worker {w} (pid {pid}) is {state}"
            for w, pid, state in states
            if state not in ("running", "sleeping", "in uninterruptible I/O")
        ]

    def begin(self, worker: int, index: int, epoch: int) -> None:
        row = self._rows[worker % len(self._rows)]
        row[_START] = time.monotonic_ns()
        row[_EPOCH] = epoch
        row[_PID] = os.getpid()
        row[_INDEX] = index

    def end(self, worker: int) -> None:
        self._rows[worker % len(self._rows), _INDEX] = IDLE

    def busy(self) -> list[Busy]:
        """The samples in flight now, longest-running first."""
        now = time.monotonic_ns()
        rows = self._rows.copy()
        out = [
            Busy(w, int(r[_PID]), int(r[_INDEX]), int(r[_EPOCH]), (now - int(r[_START])) / 1e9)
            for w, r in enumerate(rows)
            if r[_INDEX] != IDLE
        ]
        return sorted(out, key=lambda b: -b.seconds)
