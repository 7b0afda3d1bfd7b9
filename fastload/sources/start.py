"""The start method of worker processes when the Loader's options name none."""

from __future__ import annotations

import multiprocessing
import sys


def worker_start_method(requested: str | None) -> str | None:
    """``requested``, else how to start workers quickly without changing the program's own
    start method (read, never fixed: ``get_start_method(allow_none=True)``).

    On Linux that is ``fork``, also in a process that ``torch.multiprocessing.spawn`` (or
    any spawn/forkserver parent) started: such a process inherits ``spawn`` as its default,
    and spawned workers re-import torch and the dataset's modules, seconds per worker
    before the first batch. A start method this program set itself (the top process, e.g.
    ``spawn`` for CUDA in workers) is kept. Elsewhere: the program's, or the platform default.
    """
    if requested is not None:
        return requested
    current = multiprocessing.get_start_method(allow_none=True)
    if not sys.platform.startswith("linux"):
        return current
    if current is not None and multiprocessing.parent_process() is None:
        return current
    return "fork"
