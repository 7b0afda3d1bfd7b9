"""fastload.Loader: sampler → workers (torch DataLoader) → fast_collate → prefetch to device."""

from __future__ import annotations

import multiprocessing
import random
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from .config import LoaderConfig
from .fetch import BatchFetcher, StreamBatches, identity
from .prefetch import CudaPrefetcher, Normalizer
from .sampler import ShardedBatchSampler, resolve_rank
from .system import cpus_per_rank
from .threaded import ThreadBatches

SKIP_WARN_EVERY = 100


def worker_init(worker_id: int) -> None:
    """Per-worker setup: single-threaded OpenCV and torch, seeds from the loader's seed."""
    import cv2

    cv2.setNumThreads(1)
    cv2.ocl.setUseOpenCL(False)
    torch.set_num_threads(1)
    info = get_worker_info()
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


def resolve_device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available")
    return device


class _Batches:
    """Iterable of (uint8 batch, labels, lease) from the chosen backend, counting skipped samples."""

    def __init__(self, source: Any, forks: bool = False, workers: bool = False) -> None:
        self.source = source
        self.forks = forks  # workers are forked: park OpenCV's pool around it
        self.workers = workers  # batches come from worker processes
        self.skipped = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, Any]]:
        if self.forks:
            with opencv_parked():
                batches = iter(self.source)
        else:
            batches = iter(self.source)
        try:
            yield from self._counted(batches)
        except (ConnectionError, EOFError) as e:
            if not self.workers:
                raise
            # A worker that dies while its batch is in transit leaves the receiving end
            # of the pipe or of the shared-memory hand-over without a peer.
            raise RuntimeError(f"fastload: lost a DataLoader worker process or its batch (a crash: out of "
                               f"memory, or a fault in a decoder?): {e!r}") from e

    def _counted(self, batches: Iterator) -> Iterator[tuple[torch.Tensor, torch.Tensor, Any]]:
        for images, labels, skipped, *lease in batches:
            if skipped:
                before = self.skipped
                self.skipped += len(skipped)
                if before == 0 or before // SKIP_WARN_EVERY != self.skipped // SKIP_WARN_EVERY:
                    index, error = skipped[-1]
                    warnings.warn(f"fastload: skipped {self.skipped} bad sample(s) so far; "
                                  f"latest: index {index}: {error}", RuntimeWarning, stacklevel=2)
            yield images, labels, lease[0] if lease else None


class Loader:
    """Batches of normalized images on a device, from a fastload dataset.

    Args:
        dataset: A fastload dataset (``ImageFolder``, ``LMDBDataset``, ...) or anything
            with ``__len__`` and ``load(index, epoch, seed) -> (HWC uint8, label)``.
        config: A LoaderConfig to start from (the tuner writes these).
        **options: LoaderConfig fields overriding ``config``, e.g. ``batch_size=256``.

    Yields:
        (images, labels): images N×C×H×W in channels_last memory on ``loader.device``,
        normalized float (or uint8 with ``normalize=False``); labels int64.

    Raises:
        TypeError: Unknown option, or a dataset without ``load``.
        ValueError: A bad option value (the message names it).
    """

    def __init__(self, dataset: Any, config: LoaderConfig | None = None, /, **options: Any) -> None:
        if config is not None and not isinstance(config, LoaderConfig):
            raise TypeError(f"config must be a LoaderConfig, got {type(config).__name__}")
        self.streaming = callable(getattr(dataset, "records", None))
        if not self.streaming and (not callable(getattr(dataset, "load", None)) or not hasattr(dataset, "__len__")):
            raise TypeError(f"{type(dataset).__name__} is not a fastload dataset (needs __len__ and load())")
        cfg = (config or LoaderConfig()).replace(**options)
        if not self.streaming and len(dataset) == 0:
            raise ValueError("dataset is empty")
        self.config = cfg
        self.dataset = dataset
        self.device = resolve_device(cfg.device)
        self.rank, self.world_size = resolve_rank(cfg.rank, cfg.world_size)
        self.profile: dict | None = None  # the tuned profile behind num_workers="auto", if any
        self.num_workers = self._resolve_workers(cfg.num_workers)
        self.pin_memory = cfg.pin_memory if cfg.pin_memory is not None else self.device.type == "cuda"
        if self.streaming:
            if cfg.shuffle or cfg.backend != "process":
                raise ValueError("a TFRecordStream is read in file order by the process backend: "
                                 "use shuffle=False, backend='process' (or TFRecordDataset for random access)")
            dataset.shard(self.rank, self.world_size)
            dataset.seed = cfg.seed
            self.sampler = None
            source = self._dataloader = self._make_stream_loader(dataset)
        else:
            self.sampler = ShardedBatchSampler(len(dataset), cfg.batch_size, shuffle=cfg.shuffle,
                                               drop_last=cfg.drop_last, seed=cfg.seed, rank=self.rank,
                                               world_size=self.world_size)
            source = self._make_source(BatchFetcher(dataset, cfg.seed, cfg.on_error))
        workers = self._dataloader is not None and self.num_workers > 0
        forks = workers and (cfg.start_method or multiprocessing.get_start_method()) == "fork"
        self._batches = _Batches(source, forks, workers)
        self._prefetcher = CudaPrefetcher(self._batches, self.device, cfg.depth,
                                          Normalizer(cfg.mean, cfg.std, cfg.dtype, cfg.normalize))
        self._closed = False

    def _make_source(self, fetcher: BatchFetcher) -> Any:
        cfg = self.config
        if cfg.backend == "thread":
            self._dataloader = None
            # On the CPU, normalize=False hands out views of the buffer itself: no reuse then.
            return ThreadBatches(fetcher, self.sampler, self.num_workers, cfg.prefetch_factor,
                                 pin=self.pin_memory and torch.cuda.is_available(), timeout=cfg.timeout,
                                 reuse=self.device.type == "cuda" or cfg.normalize)
        self._dataloader = self._make_dataloader(fetcher)
        return self._dataloader

    def _resolve_workers(self, num_workers: int | str) -> int:
        if num_workers != "auto":
            return int(num_workers)
        from .profiles import lookup

        profile = lookup(self.dataset)
        if profile is not None:
            self.profile = profile
            return int(profile["config"]["num_workers"])
        return cpus_per_rank()

    def _worker_options(self, persistent: bool) -> dict[str, Any]:
        cfg = self.config
        options: dict[str, Any] = dict(num_workers=self.num_workers, collate_fn=identity, timeout=cfg.timeout,
                                       pin_memory=self.pin_memory and torch.cuda.is_available(),
                                       generator=torch.Generator().manual_seed(cfg.seed))
        if self.num_workers > 0:
            options.update(prefetch_factor=cfg.prefetch_factor, persistent_workers=persistent,
                           multiprocessing_context=cfg.start_method, worker_init_fn=worker_init)
        return options

    def _make_dataloader(self, fetcher: BatchFetcher) -> DataLoader:
        return DataLoader(fetcher, batch_sampler=self.sampler, **self._worker_options(self.config.persistent_workers))

    def _make_stream_loader(self, stream: Any) -> DataLoader:
        # Workers are re-created each epoch so they see the epoch set before iterating.
        batches = StreamBatches(stream, self.config.batch_size, self.config.drop_last, self.config.on_error)
        return DataLoader(batches, batch_size=None, **self._worker_options(persistent=False))

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch: its shuffle order and augmentation draws (same on every rank)."""
        if self.sampler is None:
            self.dataset.set_epoch(epoch)
        else:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        if self.sampler is None:
            raise TypeError("a streamed dataset has no length")
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._closed:
            raise RuntimeError("Loader is closed")
        return iter(self._prefetcher)

    def stats(self) -> dict:
        """Data-wait time and share, host-to-device GB/s, unpinned and skipped counts."""
        return {**self._prefetcher.stats.as_dict(), "skipped": self._batches.skipped}

    def close(self) -> None:
        """Stops workers and frees queued batches; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._prefetcher.close()
        source = self._batches.source
        if hasattr(source, "close"):
            source.close()
        # DataLoader has no public shutdown for persistent workers; dropping its
        # iterator runs _shutdown_workers() through the iterator's __del__.
        if self._dataloader is not None and getattr(self._dataloader, "_iterator", None) is not None:
            self._dataloader._iterator._shutdown_workers()
            self._dataloader._iterator = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        c = self.config
        return (f"Loader({type(self.dataset).__name__}[{len(self.dataset)}], batch_size={c.batch_size}, "
                f"num_workers={self.num_workers}, backend={c.backend!r}, device={self.device}, "
                f"rank={self.rank}/{self.world_size})")
