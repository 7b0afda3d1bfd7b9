"""The start method of worker processes when the Loader's options name none, decided as
they start."""

from __future__ import annotations

import multiprocessing
import sys
import threading

_live = [0]  # decode="gpu" decoders alive in this process (gpu_decoder_opened / _closed)
_lock = threading.Lock()


def gpu_decoder_opened() -> None:
    """A ``decode="gpu"`` decoder (nvImageCodec's, with its threads) now runs in this process."""
    with _lock:
        _live[0] += 1


def gpu_decoder_closed() -> None:
    """One of them is gone."""
    with _lock:
        _live[0] -= 1


def gpu_decoders_live() -> int:
    """How many ``decode="gpu"`` decoders are alive in this process."""
    return _live[0]


def refuse_while_bootstrapping() -> None:
    """Raises when this process is a worker started by spawn or forkserver still importing
    the program's main module: a script whose loop is not guarded would run its passes (its
    first epoch, with forked workers of its own) inside each such worker before anything fails.

    Raises:
        RuntimeError: This process is bootstrapping (multiprocessing's ``_inheriting`` flag).
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "fastload: a Loader pass was started while this process starts as a worker (spawn or "
            "forkserver, as fastload starts workers while a decode='gpu' decoder is alive), which "
            "imports your main module again: keep your loop under `if __name__ == '__main__':`"
        )


def worker_start_method(requested: str | None) -> str | None:
    """``requested``, else how to start workers quickly without changing the program's own
    start method (read, never fixed: ``get_start_method(allow_none=True)``). Asked each time
    workers start, as they start.

    While a ``decode="gpu"`` decoder is alive in this process: ``forkserver`` on Linux, also
    over a start method the program set itself. On an H200, workers forked beside a TFRecord
    stream's GPU decoders crashed in the fork (2026-11-28: a segmentation fault in both new
    workers before any of their Python ran; persistent workers forked before any decoder ran
    did not); the fork server is a clean process, started once, and the workers are forked
    from it. Such workers import the main module again, as spawn's do.

    Otherwise: on Linux ``fork``, also in a process that ``torch.multiprocessing.spawn`` (or
    any spawn/forkserver parent) started: such a process inherits ``spawn`` as its default,
    and spawned workers re-import torch and the dataset's modules, seconds per worker
    before the first batch. A start method this program set itself (the top process, e.g.
    ``spawn`` for CUDA in workers) is kept. Elsewhere: the program's, or the platform default.
    """
    if requested is not None:
        return requested
    if gpu_decoders_live() and sys.platform.startswith("linux"):
        return "forkserver"
    current = multiprocessing.get_start_method(allow_none=True)
    if not sys.platform.startswith("linux"):
        return current
    if current is not None and multiprocessing.parent_process() is None:
        return current
    return "fork"
