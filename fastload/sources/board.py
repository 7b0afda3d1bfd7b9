"""What a stream's persistent workers read next: the pass, posted by the main process.

A stream's workers read their slots' records with the pass's epoch, seed, rank, resume point
and order; workers that persist across passes (as an indexed source's do) started before the
pass was known. So the main process posts each pass here, in a memfd segment (:mod:`.segments`:
forked workers inherit it, spawned ones open it through ``/proc``), before it asks them to
begin it; each worker reads it as its pass begins. The board's generation, read before each
batch, tells a worker that the pass it reads was given up (:meth:`PassBoard.stop`), also
when that happened before the worker read the pass: the pass carries the generation it was
posted with.

What is posted is the main process's own object, pickled; nothing of a dataset's bytes.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

from .segments import Segments

_HEADER = 24  # bytes (three int64): the generation, the pickled pass's length, the generation it was posted with


class PassBoard:
    """The pass under way and its generation, in one memfd segment of the main process."""

    def __init__(self) -> None:
        self._segments = Segments(f"fastload-pass-{os.getpid()}", 1)
        self._header = self._map(_HEADER, grow=True)[:_HEADER].view(np.int64)
        self._header[:] = 0

    def _map(self, nbytes: int, grow: bool = False) -> np.ndarray:
        return self._segments.map(0, nbytes, grow).numpy()

    def __getstate__(self) -> Segments:
        return self._segments

    def __setstate__(self, segments: Segments) -> None:
        self._segments = segments
        self._header = self._map(_HEADER)[:_HEADER].view(np.int64)

    @property
    def generation(self) -> int:
        """Bumped by each :meth:`post` and :meth:`stop`."""
        return int(self._header[0])

    def post(self, run: Any) -> None:
        """Makes ``run`` the pass that workers read next (main process, between passes)."""
        data = pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL)
        view = self._map(_HEADER + len(data), grow=True)
        view[_HEADER : _HEADER + len(data)] = np.frombuffer(data, np.uint8)
        self._header = view[:_HEADER].view(np.int64)
        generation = int(self._header[0]) + 1
        self._header[1:] = (len(data), generation)
        self._header[0] = generation  # last: a worker that sees the new generation sees the new pass

    def stop(self) -> None:
        """Gives up the pass under way: each worker ends its slot before its next batch."""
        self._header[0] += 1

    def read(self) -> tuple[int, Any]:
        """(the generation it was posted with, the pass posted last), in a worker as its pass
        begins: a :meth:`stop` since then already shows in :attr:`generation`."""
        _, n, generation = (int(v) for v in self._header)
        view = self._map(_HEADER + n)
        self._header = view[:_HEADER].view(np.int64)
        return generation, pickle.loads(view[_HEADER : _HEADER + n].tobytes())

    def close(self) -> None:
        self._segments.close()
