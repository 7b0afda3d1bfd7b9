"""The batch source for a dataset and a config: processes, threads or a stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import DEVICE_AHEAD, LoaderConfig
from ..datasets.protocols import is_stream, traits_of
from .batchplan import cpu_executor
from .fetch import SampleLoader
from .handoff import BufferTable, SharedPool, worker_buffers
from .indexed import Maker
from .inflight import InFlight
from .maker import BatchMaker
from .packed import GpuRows, PackMaker
from .pools import BufferPool, PlainPool
from .process import ProcessSource
from .sampler import EpochClock, ShardedBatchSampler
from .samples import Samples
from .source import BatchSource
from .stream import StreamSource
from .thread import ThreadSource
from .workers import WorkerOptions


def pin_memory(requested: bool | None, device: torch.device) -> bool:
    """Whether batches for ``device`` are to be pinned: as ``requested``, by default when
    they go to a CUDA device (the Loader's ``pin_memory``; its sources pin only where CUDA is)."""
    return bool(requested) if requested is not None else device.type == "cuda"


def build_source(
    samples: Any,
    cfg: LoaderConfig,
    rank: int,
    world_size: int,
    device: torch.device,
    *,
    order_seed: int | None = None,
    epochs: EpochClock | None = None,
    gpu: GpuRows | None = None,
    cpu_share: Callable[[], float] | None = None,
) -> BatchSource:
    """The :class:`~fastload.sources.BatchSource` that runs ``samples`` under ``cfg``.

    Backends differ in where a batch is made (worker processes, threads, this process) and
    which pool lends its buffers; what makes it is chosen here, once: the GPU's packing
    where ``gpu`` is given, else the CPU executor :func:`~fastload.sources.batchplan.cpu_executor` picks.

    Args:
        samples: A fastload dataset (``load``), a wrapped user dataset, or a stream.
        cfg: The resolved config (``num_workers`` an int, ``seed`` drawn).
        rank, world_size: This rank among all.
        device: Where batches go (pinning and buffer reuse depend on it).
        order_seed: Seed of the shuffle order (default: ``cfg.seed``).
        epochs: Where the sampler keeps its epoch (the Loader's progress).
        gpu: ``decode="gpu"``: the transforms as the device runs them; workers then pack
            batches for it (:class:`~fastload.sources.packed.PackMaker`) instead of decoding.
        cpu_share: With ``gpu``: the share of GPU-decodable rows the workers decode on the
            CPU, read for each request as it is sent (:class:`fastload.device.gpudecode.share.CpuShare`).
    """
    pin = pin_memory(cfg.pin_memory, device) and torch.cuda.is_available()
    workers = int(cfg.num_workers)
    assert cfg.seed is not None  # drawn by the Loader (and the tuner) before a source is built
    options = WorkerOptions(
        workers,
        cfg.prefetch_factor,
        cfg.persistent_workers,
        cfg.multiprocessing_context,  # None: decided as the workers start (start.worker_start_method)
        cfg.timeout,
        pin,
        cfg.seed,
        pin_device=device if pin else None,
    )
    if is_stream(samples):
        refusal = stream_refusal(type(samples).__name__, cfg.shuffle and not traits_of(samples).shuffles)
        if refusal is not None:
            raise ValueError(refusal)
        return StreamSource(
            samples,
            batch_size=cfg.batch_size,
            drop_last=cfg.drop_last,
            on_error=cfg.on_error,
            rank=rank,
            world_size=world_size,
            options=options,
            shuffle=cfg.shuffle,
            threads=cfg.backend == "thread",
            reuse=device.type == "cuda" or cfg.normalize is not False,
            gpu=gpu,
            cpu_share=cpu_share if gpu is not None else None,
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
        epochs=epochs,
    )
    threads = cfg.backend == "thread"
    # A row for this process too where it loads samples itself (threads; GPU decode's fall-backs).
    inflight = InFlight(workers + 1 if threads or gpu is not None else max(1, workers))
    loader = SampleLoader(Samples(samples), cfg.on_error, inflight)
    # What makes a batch is chosen once, for every backend: the GPU's packing, or the CPU executor's batch.
    maker: Maker = PackMaker(loader, gpu) if gpu is not None else BatchMaker(loader, cpu_executor(loader.samples))
    share = cpu_share if gpu is not None else None
    if threads:
        # prefetch_factor means what it means for processes: batches ahead per worker.
        # On the CPU, normalize=False hands out views of the buffer itself: no reuse then.
        # GPU batches are packed bytes: a new buffer each.
        source = ThreadSource(
            maker,
            sampler,
            workers,
            workers * cfg.prefetch_factor,
            pin=pin,
            timeout=cfg.timeout,
            reuse=gpu is None and (device.type == "cuda" or cfg.normalize is not False),
            device_ahead=DEVICE_AHEAD,
            pin_device=options.pin_device,
        )
        source.cpu_share = share
        return source
    # Made in this process (no workers), a batch is pinned as the Loader says and for its
    # device: not for a CPU loader, nor in another GPU's context; a GPU batch is packed bytes.
    pool: BufferPool = PlainPool(pin=pin and gpu is None, device=options.pin_device)
    if workers > 0 and BufferTable.supported:
        pool = SharedPool(BufferTable(workers, worker_buffers(cfg.prefetch_factor, gpu is not None)))
    return ProcessSource(maker, pool, sampler, options, cpu_share=share)


def stream_refusal(kind: str, unshuffled: bool) -> str | None:
    """Why a stream (``kind``) cannot run as asked: ``shuffle=True`` on a stream read in file
    order (``unshuffled``); None when it can."""
    if not unshuffled:
        return None
    return f"a {kind} is read in file order: use shuffle=False" + (
        " (or TFRecordDataset over uncompressed files for random access)" if kind == "TFRecordStream" else ""
    )
