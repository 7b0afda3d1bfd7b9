"""Which sample each worker is loading, readable from the main process.

Workers (processes or threads) mark a row of a small shared-memory table before each
sample and clear it after. The watchdog reads it to say what a stalled pipeline is stuck
on, and worker-death errors read it to name the sample that was being loaded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..system import process_state

_PID, _INDEX, _EPOCH, _START, _NAMED, _STARTS, _BORN = range(7)
IDLE = -1
NAME_BYTES = 512  # of a sample's own name in flight (a stream record's shard, key or byte offset)


@dataclass(frozen=True)
class Busy:
    """One worker's sample in flight."""

    worker: int
    pid: int
    index: int
    epoch: int
    seconds: float
    name: str | None = None  # what the worker named it (a stream's record: "record N (where)")


class InFlight:
    """A row per worker: (pid, sample index or -1, epoch, start time in monotonic ns, bytes of
    its name or 0, how many processes registered as it, the last of them), and the name itself
    beside it: a sample the main process cannot name by its index (a stream's record) is named
    by the worker."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        table = torch.full((workers, 7), IDLE, dtype=torch.int64)
        table[:, _STARTS] = 0
        names = torch.zeros((workers, NAME_BYTES), dtype=torch.uint8)
        table.share_memory_()  # before any numpy view: see storage.py
        names.share_memory_()
        self._setup(table, names)

    def _setup(self, table: torch.Tensor, names: torch.Tensor) -> None:
        self._table, self._rows, self._names_table, self._names = table, table.numpy(), names, names.numpy()

    def __getstate__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._table, self._names_table

    def __setstate__(self, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._setup(*state)

    def __len__(self) -> int:
        return len(self._rows)

    def register(self, worker: int) -> None:
        """Records the calling process as ``worker`` before it loads anything."""
        row = self._rows[worker % len(self._rows)]
        row[_INDEX] = IDLE
        row[_PID] = row[_BORN] = os.getpid()
        row[_STARTS] += 1

    def starts(self) -> np.ndarray:
        """How many processes have registered as each worker so far (a copy): a worker whose count
        has not moved since its process was forked has not started."""
        return self._rows[:, _STARTS].copy()

    def started_since(self, starts: np.ndarray) -> dict[int, int]:
        """worker → pid of the workers that registered since ``starts`` (:meth:`starts` then),
        also those that finished since (:meth:`finished` forgets only their ``pids()`` entry)."""
        rows = self._rows.copy()
        return {w: int(rows[w, _BORN]) for w in range(len(rows)) if rows[w, _STARTS] != starts[w]}

    def finished(self, worker: int) -> None:
        """Worker ``worker`` has nothing more to load and is about to be told to exit: its pid
        leaves the table (its exit is not a death)."""
        row = self._rows[worker % len(self._rows)]
        row[_INDEX] = IDLE
        row[_PID] = IDLE

    def threads_registered(self) -> bool:
        """Whether workers of this process (threads) have registered here."""
        return bool((self._rows[:, _PID] == os.getpid()).any())

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

    def begin(self, worker: int, index: int, epoch: int, name: str | None = None) -> int:
        """Marks sample ``index`` in flight in ``worker``; ``name``: what to call it where its
        index alone does not say (a stream's record: its shard, key or byte offset). Returns
        the mark, for :meth:`end`."""
        w = worker % len(self._rows)
        row = self._rows[w]
        row[_NAMED] = 0
        if name is not None:
            data = name.encode("utf-8", "replace")[:NAME_BYTES]
            self._names[w, : len(data)] = np.frombuffer(data, np.uint8)
            row[_NAMED] = len(data)
        row[_START] = mark = time.monotonic_ns()
        row[_EPOCH] = epoch
        row[_PID] = os.getpid()
        row[_INDEX] = index
        return mark

    def end(self, worker: int, mark: int) -> None:
        """Sample ``mark`` (:meth:`begin`'s) of ``worker`` is done; the row is left as it is where
        another sample was marked since: a thread the thread runner replaced, stuck in a
        sample past the timeout, ends it after its replacement, which uses the same row."""
        row = self._rows[worker % len(self._rows)]
        if row[_START] == mark:
            row[_INDEX] = IDLE

    def busy(self) -> list[Busy]:
        """The samples in flight now, longest-running first."""
        now = time.monotonic_ns()
        rows, names = self._rows.copy(), self._names.copy()
        out = [
            Busy(w, int(r[_PID]), int(r[_INDEX]), int(r[_EPOCH]), (now - int(r[_START])) / 1e9, _name(names[w], r))
            for w, r in enumerate(rows)
            if r[_INDEX] != IDLE
        ]
        return sorted(out, key=lambda b: -b.seconds)


def _name(names: np.ndarray, row: np.ndarray) -> str | None:
    n = int(row[_NAMED])
    return bytes(names[:n]).decode("utf-8", "replace") if 0 < n <= NAME_BYTES else None
