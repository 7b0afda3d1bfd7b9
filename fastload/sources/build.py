"""The batch source for a dataset and a config: processes, threads or a stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import LoaderConfig
from .fetch import BatchFetcher
from .handoff import SlotTable
from .inflight import InFlight
from .process import ProcessSource, WorkerOptions
from .sampler import EpochRequests, ShardedBatchSampler
from .start import worker_start_method
from .stream import StreamSource
from .thread import ThreadSource

DEVICE_AHEAD = 2  # batches the device stage copies ahead of the consumer (a fixed part of the pipeline)


def is_stream(dataset: Any) -> bool:
    """A record stream (read in order by slots, e.g. TFRecordStream), not an indexed dataset."""
    return callable(getattr(dataset, "records_for", None))


def build_source(
    samples: Any,
    cfg: LoaderConfig,
    rank: int,
    world_size: int,
    device: torch.device,
    *,
    order_seed: int | None = None,
    epochs: EpochRequests | None = None,
    make_fetcher: Callable[[InFlight], BatchFetcher] | None = None,
) -> Any:
    """The :class:`~fastload.sources.BatchSource` that runs ``samples`` under ``cfg``.

    Args:
        samples: A fastload dataset (``load``), a wrapped user dataset, or a stream.
        cfg: The resolved config (``num_workers`` an int).
        rank, world_size: This rank among all.
        device: Where batches go (pinning and buffer reuse depend on it).
        order_seed: Seed of the shuffle order (default: ``cfg.seed``).
        epochs: Where the sampler reports its ``set_epoch`` calls (the Loader's).
        make_fetcher: Makes the workers' fetcher from the in-flight table instead of the
            default one (``decode="gpu"``: the device stage's, whose workers send encoded
            batches; the Loader passes it in, so this layer imports nothing above it).
    """
    pin = bool(cfg.pin_memory if cfg.pin_memory is not None else device.type == "cuda") and torch.cuda.is_available()
    workers = int(cfg.num_workers)
    options = WorkerOptions(
        workers,
        cfg.prefetch_factor,
        cfg.persistent_workers,
        worker_start_method(cfg.multiprocessing_context),
        cfg.timeout,
        pin,
        cfg.seed,
        pin_device=device if pin else None,
    )
    if is_stream(samples):
        if (cfg.shuffle and not getattr(samples, "shuffles", False)) or cfg.backend != "process":
            raise ValueError(
                "a stream is read in file order by worker processes: use shuffle=False, "
                "backend='process' (or TFRecordDataset for random access)"
            )
        return StreamSource(
            samples,
            batch_size=cfg.batch_size,
            drop_last=cfg.drop_last,
            on_error=cfg.on_error,
            seed=cfg.seed,
            rank=rank,
            world_size=world_size,
            options=options,
            shuffle=cfg.shuffle,
        )
    sampler = ShardedBatchSampler(
        len(samples),
        cfg.batch_size,
        shuffle=cfg.shuffle,
        drop_last=cfg.drop_last,
        seed=cfg.seed if order_seed is None else order_seed,
        rank=rank,
        world_size=world_size,
        drop_uneven=cfg.shard.drop_uneven,
        requests=epochs,
    )
    threads = cfg.backend == "thread"
    # A row for this process too where it loads samples itself (threads; GPU decode's fall-backs).
    inflight = InFlight(workers + 1 if threads or make_fetcher is not None else max(1, workers))
    if make_fetcher is not None:
        fetcher: BatchFetcher = make_fetcher(inflight)
    else:
        # A worker has at most prefetch_factor batches in flight, and one is being copied
        # out of its slot; one more slot spares a fresh buffer when a copy-out lags.
        slots = (
            SlotTable(workers, cfg.prefetch_factor + 2) if workers > 0 and not threads and SlotTable.supported else None
        )
        fetcher = BatchFetcher(samples, cfg.seed, cfg.on_error, inflight, slots)
    if threads:
        # prefetch_factor means what it means for processes: batches ahead per worker.
        # On the CPU, normalize=False hands out views of the buffer itself: no reuse then.
        return ThreadSource(
            fetcher,
            sampler,
            workers,
            workers * cfg.prefetch_factor,
            pin=pin,
            timeout=cfg.timeout,
            reuse=device.type == "cuda" or cfg.normalize is not False,
            device_ahead=DEVICE_AHEAD,
            pin_device=options.pin_device,
        )
    return ProcessSource(fetcher, sampler, options)
