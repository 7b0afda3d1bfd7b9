"""Starting torch DataLoader's worker processes as fastload runs them: their options
(:class:`WorkerOptions`), their setup (:func:`worker_init`), DataLoader's arguments, and the
start itself (:func:`start_workers`: descriptors checked, OpenCV's pool parked, this process's
objects frozen while they fork)."""

from __future__ import annotations

import errno
import multiprocessing
import pickle
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from ..collate import pinning_on
from . import deaths
from .closing import wait_tick
from .descriptors import check_descriptors, dataloader_descriptors, descriptor_limit
from .frozen import parent_objects_frozen
from .inflight import InFlight
from .start import worker_start_method


@runtime_checkable
class Tracked(Protocol):
    """A dataset DataLoader's workers run that marks the samples in flight (the workers register)."""

    inflight: InFlight


@dataclass(frozen=True)
class WorkerOptions:
    """How a source runs its workers (resolved from LoaderConfig by the Loader)."""

    num_workers: int
    prefetch_factor: int = 2
    persistent: bool = True
    start_method: str | None = None
    timeout: float = 0.0
    pin: bool = False
    seed: int = 0
    pin_device: Any = None  # the CUDA device batches are pinned for (its context, see pinning_on)

    def start_now(self) -> str:
        """How workers started now start: ``start_method`` (the Loader's
        ``multiprocessing_context``), else :func:`~fastload.sources.start.worker_start_method`'s
        choice at this moment (a GPU decoder alive in this process changes it)."""
        # Read, never fixed: get_start_method() without allow_none would set the program's default.
        return worker_start_method(self.start_method) or multiprocessing.get_all_start_methods()[0]


def worker_init(worker_id: int) -> None:
    """Per-worker setup: single-threaded OpenCV and torch, seeds from the loader's seed."""
    import cv2

    cv2.setNumThreads(1)
    cv2.ocl.setUseOpenCL(False)
    torch.set_num_threads(1)
    # Batches travel as named shared memory: with torch's default (file descriptors sent by the
    # worker on request), the consumer waits without limit, past any timeout, for a batch of a
    # worker that is stopped. Set here, the strategy applies to this worker process only.
    torch.multiprocessing.set_sharing_strategy("file_system")
    info = get_worker_info()
    if info is not None and isinstance(info.dataset, Tracked):
        info.dataset.inflight.register(info.id)
    if info is not None and isinstance(info.dataset, ShowsDataset):
        # get_worker_info().dataset in the user's code (a dataset's __getitem__ sharding its
        # reads by worker) is the dataset given to the Loader, not the batch maker torch runs.
        object.__setattr__(info, "dataset", info.dataset.shown)
    seed = info.seed if info is not None else worker_id
    np.random.seed(seed % 2**32)
    random.seed(seed)


@contextmanager
def opencv_parked():
    """Stops OpenCV's thread pool while workers are forked, then restores it.

    A forked child inherits the pool's state but not its threads; its first OpenCV
    call (even setNumThreads) then waits forever for them.
    """
    cv2 = sys.modules.get("cv2")
    if cv2 is None:
        yield
        return
    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(previous)


def identity(batch: Any) -> Any:
    return batch


class ShowsDataset:
    """A torch Dataset the workers run that shows another as ``get_worker_info().dataset``:
    :attr:`shown`, the dataset the user gave."""

    @property
    def shown(self) -> Any:
        """What ``get_worker_info().dataset`` is in a worker."""
        raise NotImplementedError


def dataloader_options(options: WorkerOptions, persistent: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        num_workers=options.num_workers,
        collate_fn=identity,
        # DataLoader waits for a batch in ticks, between which the pass looks at its closed event
        # and its own timeout (worker_batches). Without workers it refuses a timeout: the waits are ours.
        timeout=wait_tick(options.timeout) if options.num_workers > 0 else 0,
        # Without workers a batch is made here, in memory its pool pinned for the device:
        # DataLoader would pin its labels again, in the context of the current device.
        pin_memory=options.pin and options.num_workers > 0,
        generator=torch.Generator().manual_seed(options.seed),
    )
    if options.num_workers > 0:
        kw.update(
            prefetch_factor=options.prefetch_factor,
            persistent_workers=persistent,
            multiprocessing_context=options.start_method,  # None: start_workers decides, as they start
            worker_init_fn=worker_init,
        )
    return kw


def start_workers(loader: DataLoader, options: WorkerOptions, running: bool = False) -> Iterator:
    """``iter(loader)``, with OpenCV's pool parked and this process's objects frozen while
    workers are forked (so that their garbage collector does not copy them, see
    :mod:`.frozen`); its pin-memory thread pins for the current device, made
    ``options.pin_device`` here. ``running``: the loader's persistent workers run already
    (a new pass opens no descriptors).

    Raises:
        OSError: Too few descriptors left for the workers' pipes (the message says what to do).
    """
    doing = f"starting {options.num_workers} worker processes"
    if options.num_workers > 0 and not running:
        check_descriptors(dataloader_descriptors(options.num_workers), doing)
    method = options.start_now()  # decided as they start: a GPU decoder alive now means a fork server
    try:
        with pinning_on(options.pin_device if options.pin else None), deaths.starting():
            if options.num_workers > 0 and not running:
                loader.multiprocessing_context = method
            if options.num_workers == 0 or method != "fork":
                return iter(loader)
            with opencv_parked(), parent_objects_frozen():
                return iter(loader)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise descriptor_limit(e, doing) from None
        raise
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        if running or options.start_method is not None or method != "forkserver":
            raise
        # Our choice, not the program's: say why, and how to fork anyway.
        raise type(e)(
            f"{e}; fastload starts these workers with a fork server because a decode='gpu' decoder is "
            "alive in this process (workers forked beside one crashed on a GPU), so the dataset and its "
            "transforms must pickle; or name multiprocessing_context='fork' to fork anyway"
        ) from e
