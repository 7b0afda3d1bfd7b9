"""Forked workers keep sharing the parent's Python objects: their garbage collector skips them.

A worker started by fork shares the parent's memory copy-on-write. fastload's per-sample
data are flat arrays that workers read without writing (:mod:`fastload.datasets.storage`),
but CPython's full (generation 2) collection writes into the header of every object it
tracks, so the first full collection in a worker copies every page that holds one of the
parent's objects: about 180,000 objects (35 MB) in a program that imported torch, more with
the user's own (a million per-sample lists, dicts or objects add them all). When that
collection comes depends on how many objects outlive the young generations in the worker:
after some 170 batches of 256 in issue 32 item 8, each worker's USS then grew 37 MB at once
([anon]: pymalloc arenas, and [heap]).

``gc.freeze()`` just before the fork moves the parent's objects to the permanent
generation, which no collection visits (CPython's recipe for fork without exec, see
``gc.freeze``); the children keep them there. The parent unfreezes right after the fork,
so its own objects are collected as before, unless the program had frozen objects itself
(it then manages freezing: fastload leaves what it froze frozen too).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_forking = 0  # threads inside parent_objects_frozen(): the last one out unfreezes
_unfreeze = False  # nothing was frozen when the first one came in


@contextmanager
def parent_objects_frozen() -> Iterator[None]:
    """Context for forking workers: every object of this process is frozen while inside.

    Nested or concurrent uses (two Loaders starting workers from two threads) keep the
    objects frozen until the last one leaves.
    """
    global _forking, _unfreeze
    with _lock:
        if _forking == 0:
            _unfreeze = gc.get_freeze_count() == 0
        _forking += 1
        gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _forking -= 1
            if _forking == 0 and _unfreeze:
                gc.unfreeze()
