"""The start method of worker processes when the Loader's options name none."""

from __future__ import annotations

import multiprocessing
import sys


def worker_start_method(requested: str | None, beside_gpu_decode: bool = False) -> str | None:
    """``requested``, else how to start workers quickly without changing the program's own
    start method (read, never fixed: ``get_start_method(allow_none=True)``).

    ``beside_gpu_decode``: workers are started while ``decode="gpu"``'s decoders may run in
    this process (a stream's workers each pass, or workers that are not persistent). Then
    ``forkserver`` on Linux: a process forked while nvImageCodec's and CUDA's threads run
    crashed in the fork on an H200 (2026-11-28: a TFRecord stream's second pass, segmentation
    fault in both new workers before any of their Python ran); the fork server is a clean
    process, started once, and the workers are forked from it.

    On Linux that is ``fork``, also in a process that ``torch.multiprocessing.spawn`` (or
    any spawn/forkserver parent) started: such a process inherits ``spawn`` as its default,
    and spawned workers re-import torch and the dataset's modules, seconds per worker
    before the first batch. A start method this program set itself (the top process, e.g.
    ``spawn`` for CUDA in workers) is kept. Elsewhere: the program's, or the platform default.
    """
    if requested is not None:
        return requested
    if beside_gpu_decode and sys.platform.startswith("linux"):
        return "forkserver"
    current = multiprocessing.get_start_method(allow_none=True)
    if not sys.platform.startswith("linux"):
        return current
    if current is not None and multiprocessing.parent_process() is None:
        return current
    return "fork"
