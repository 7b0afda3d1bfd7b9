"""The lifetime of a Loader's passes: one pass at a time, loud when ended, closed at exit,
and never continued (or freed) by a forked process."""

from __future__ import annotations

import atexit
import os
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from ..sources.failures import PassClosed

_LIVE: weakref.WeakSet = weakref.WeakSet()
# In a forked process: its copies of the parent's sources and passes. Held until the process
# ends, never closed or freed here: closing a DataLoader iterator signals the parent's workers
# to stop, and a buffer freed here is one the parent's workers may still be writing.
_INHERITED: list = []


class Owner(Protocol):
    """What the pass lifecycle asks of a Loader."""

    def close(self) -> None: ...

    def _forked(self) -> list:
        """In a forked child: marks the Loader's source as the parent's and returns what to
        keep untouched (its source, its pass's batches, ...)."""


class Raised:
    """A batch's error, yielded in the batch's place by a pass's batches: the pass raises it,
    and its next ``next()`` goes on with the following batch (as DataLoader's iterator does).

    Attributes:
        error: The error, with its type and traceback as the batch's loading raised it.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Pass:
    """One pass over a Loader: an iterator that keeps its Loader alive.

    A pass ended by a newer pass of the same Loader, or by ``close()``, raises on the
    next ``next()`` instead of stopping quietly, so a nested loop over one Loader (or an
    old iterator) cannot silently cut an epoch short. A batch whose loading failed raises
    its error in its turn (a :class:`Raised` among the batches); the next ``next()`` hands
    out the batch after it.
    """

    def __init__(self, owner: Any, batches: Iterator) -> None:
        self._owner, self._batches = owner, batches  # the owner lives as long as the pass
        self._ended_by: str | None = None
        self._parent: int | None = None  # in a forked child: the pid that started this pass

    def __iter__(self) -> Pass:
        return self

    def __next__(self) -> Any:
        if self._parent is not None:
            raise RuntimeError(
                f"this pass over the Loader was started by process {self._parent} and this process "
                f"({os.getpid()}) is a fork of it: its workers and buffers are the parent's, which goes on "
                "with it. Start a pass of this process's own: iterate the Loader again here "
                "(or make the Loader after the fork)"
            )
        if self._ended_by is not None:
            raise self._ended()
        try:
            out = next(self._batches)
        except ValueError as e:
            # Another thread is closing the pass's generator right now (close() from another thread).
            if self._ended_by is not None and "generator already executing" in str(e):
                raise self._ended() from None
            raise
        if isinstance(out, Raised):
            raise out.error  # here, not in the generator: it stays suspended where it yielded
        return out

    def _ended(self) -> RuntimeError:
        if self._ended_by == "close()":  # the one closed error, whichever thread closed it and when
            return PassClosed()
        return RuntimeError(
            f"this pass over the Loader was ended by {self._ended_by}; "
            "a Loader runs one pass at a time (iterate it again for the next epoch)"
        )

    def end(self, by: str) -> None:
        """Stops the pass (its workers' buffers are handed back).

        Raises:
            RuntimeError: The pass is running in another thread right now.
        """
        if by == "close()" and self._ended_by is None:
            # Before closing: a next() in another thread while the generator closes sees it (and
            # where the pass runs in another thread right now, it ends at its next next(): the
            # closed source stops the one under way).
            self._ended_by = by
        try:
            self._batches.close()
        except ValueError:  # "generator already executing": another thread is inside it
            raise RuntimeError(
                "the Loader's current pass is running in another thread; a Loader is iterated by one thread at a time"
            ) from None
        if self._ended_by is None:
            self._ended_by = by

    def disowned(self, parent: int) -> Iterator:
        """Called in a forked child: this pass is ``parent``'s; a ``next()`` here raises. Returns
        its batches, which the caller keeps (closing them here would stop the parent's workers)."""
        self._parent = parent
        batches, self._batches = self._batches, iter(())
        return batches


def register(loader: Owner) -> None:
    """Closes ``loader`` at interpreter exit if the program did not (also after Ctrl-C):
    workers and decode threads then stop before the interpreter tears itself down."""
    _LIVE.add(loader)


def fork_safe_threads() -> None:
    """At a pass's start: in a forked process, torch's CPU ops run on one thread from now on
    (as in DataLoader's workers). torch's intra-op thread pool (OpenMP) started in the parent
    does not survive ``fork()``: a parallel op here (copying a batch of more than 32 KB out of
    a worker's buffer, normalizing it) would wait forever for threads that do not exist."""
    global _FORKED
    if _FORKED:
        _FORKED = False
        import torch

        if torch.get_num_threads() > 1:
            torch.set_num_threads(1)


_FORKED = False  # this process is a fork whose torch threads fork_safe_threads has not yet set


def _forked() -> None:
    """In the child of ``os.fork()`` (``multiprocessing``'s fork too): every Loader's source,
    workers, threads and pass are the parent's. Each is kept here, untouched; the child's
    next pass over a Loader builds its own."""
    global _FORKED
    _FORKED = True
    for loader in list(_LIVE):
        _INHERITED.append(loader._forked())


os.register_at_fork(after_in_child=_forked)


@atexit.register
def _close_all() -> None:
    for loader in list(_LIVE):
        try:
            loader.close()
        except Exception:
            pass
