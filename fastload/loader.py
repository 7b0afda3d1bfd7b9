"""fastload.Loader: the epoch counter, a batch source, and the device stage."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import resume
from .batch import HostBatch, SkippedSample
from .config import LoaderConfig
from .datasets.wrap import WrappedDataset
from .normalize import Normalizer
from .passes import Pass, register, user_stacklevel
from .prefetch import CudaPrefetcher
from .sampler import ShardedBatchSampler, check_epoch, resolve_rank
from .sources import BatchFetcher, InFlight, ProcessSource, StreamSource, ThreadSource, WorkerOptions
from .sources.failures import is_worker_failure, worker_failure
from .sources.watchdog import Watchdog
from .system import cpus_per_rank

SKIP_WARN_EVERY = 100
MAX_SKIPPED_KEPT = 10_000


def resolve_device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available")
    return device


def is_stream(dataset: Any) -> bool:
    return callable(getattr(dataset, "records_for", None))


@dataclass
class _Position:
    """How far the pass of ``epoch`` got: ``consumed`` batches handed to the user, after the
    earlier stages in ``history`` (a resumed epoch); ``done`` once it ended by itself."""

    epoch: int
    history: tuple[resume.Stage, ...] = ()
    consumed: int = 0
    done: bool = False


class Loader:
    """Batches of normalized images on a device, from a fastload dataset or your own.

    Each pass over the loader is a new epoch (new shuffle order and augmentation draws):
    the first pass is epoch 0, the next 1, and so on; ``set_epoch(e)`` makes the next
    pass epoch ``e``. Starting a pass ends an unfinished earlier one.

    Rank and world size not given are read from torch.distributed when it is
    initialized, also when that happens after construction (as Lightning's Trainer does):
    the next pass (or ``len``) then shards by rank.

    ``state_dict()`` says where the loader is in an epoch; ``load_state_dict`` on a new
    Loader (same dataset, seed, batch size; any ranks, workers or backend) makes its next
    pass hand out exactly the batches that would have come next.

    Args:
        dataset: A fastload dataset (``ImageFolder``, ``LMDBDataset``, ...), anything
            with ``__len__`` and ``load(index, epoch, seed) -> (HWC uint8, target)``, a
            stream (``TFRecordStream``), or a map-style dataset of your own (``__len__`` and
            ``__getitem__``), wrapped in :class:`~fastload.WrappedDataset`.
        config: A LoaderConfig to start from (the tuner writes these).
        **options: LoaderConfig fields overriding ``config``, e.g. ``batch_size=256``.

    Yields:
        (images, targets): images N×C×H×W in channels_last memory on ``loader.device``,
        normalized float (or uint8 with ``normalize=False``); targets int64 N for int
        labels, else float32 N or N×... (see :mod:`fastload.targets`). With
        ``return_index=True``: (images, targets, indices), indices int64 on the CPU.

    Raises:
        TypeError: Unknown option, or a dataset fastload cannot read (the message says why).
        ValueError: A bad option value (the message names it).
    """

    def __init__(self, dataset: Any, config: LoaderConfig | None = None, /, **options: Any) -> None:
        if config is not None and not isinstance(config, LoaderConfig):
            raise TypeError(f"config must be a LoaderConfig, got {type(config).__name__}")
        self._closed = True  # until construction succeeds (for __del__)
        self.streaming = is_stream(dataset)
        samples = dataset
        if not self.streaming and not (callable(getattr(dataset, "load", None)) and hasattr(dataset, "__len__")):
            samples = WrappedDataset(dataset)
        if not self.streaming and len(samples) == 0:
            raise ValueError("dataset is empty")
        self.dataset = dataset  # as given (DataLoader's attribute)
        self._samples = samples  # what the workers load: the dataset, or its WrappedDataset
        self.profile: dict | None = None  # the tuned profile behind num_workers="auto", if any
        self.config = cfg = self._resolve_auto((config or LoaderConfig()).replace(**options), options)
        self.device = resolve_device(cfg.device)
        self.rank, self.world_size = resolve_rank(cfg.rank, cfg.world_size)
        self.num_workers = int(cfg.num_workers)
        self.pin_memory = cfg.pin_memory if cfg.pin_memory is not None else self.device.type == "cuda"
        self.skipped: list[SkippedSample] = []  # what on_error="skip" replaced (the most recent 10,000)
        self.skipped_count = 0
        self.sampler: ShardedBatchSampler | None = None
        self._gpu = None  # the GPU decode pipeline (decode="gpu")
        if cfg.decode == "gpu":
            from .gpudecode import check_setup

            self._gpu = check_setup(samples, self.device, cfg.backend, self.streaming)
        self._source = self._make_source()
        inflight = self._source.inflight
        self._watchdog = Watchdog(inflight, None if self.streaming else samples, cfg.stall_warning)
        normalizer = Normalizer(cfg.mean, cfg.std, cfg.dtype, cfg.normalize)
        if self._gpu is not None:
            from .gpudecode import GpuDecodeStage

            self._prefetcher = GpuDecodeStage(self.device, cfg.depth, normalizer, cfg.return_index,
                                              self._source.fetcher, self._record_skipped)
        else:
            self._prefetcher = CudaPrefetcher((), self.device, cfg.depth, normalizer, cfg.return_index)
        self._sampler_epoch = 0  # the epoch last written to sampler.epoch (see _adopt_sampler_epoch)
        self._next_epoch = 0
        self.epoch: int | None = None  # of the current (or last) pass
        self._pass: Pass | None = None
        self._position: _Position | None = None  # of the current (or interrupted) pass
        self._plan: resume.Plan | None = None  # the next pass, from a loaded state
        self._fingerprint: str | None = None
        self._closed = False
        register(self)

    def _resolve_auto(self, cfg: LoaderConfig, explicit: dict) -> LoaderConfig:
        if cfg.num_workers != "auto":
            return cfg
        from .profiles import lookup, settings_for_rank

        profile = lookup(self._samples)
        if profile is None:
            return cfg.replace(num_workers=cpus_per_rank())
        self.profile = profile
        tuned = {k: v for k, v in settings_for_rank(profile).items() if k == "num_workers" or k not in explicit}
        return cfg.replace(**tuned)

    def _options(self) -> WorkerOptions:
        cfg = self.config
        return WorkerOptions(self.num_workers, cfg.prefetch_factor, cfg.persistent_workers, cfg.start_method,
                             cfg.timeout, self.pin_memory and torch.cuda.is_available(), cfg.seed)

    def _make_source(self) -> Any:
        cfg = self.config
        if self.streaming:
            if cfg.shuffle or cfg.backend != "process":
                raise ValueError("a stream is read in file order by worker processes: use shuffle=False, "
                                 "backend='process' (or TFRecordDataset for random access)")
            return StreamSource(self._samples, batch_size=cfg.batch_size, drop_last=cfg.drop_last,
                                on_error=cfg.on_error, seed=cfg.seed, rank=self.rank, world_size=self.world_size,
                                options=self._options())
        self.sampler = ShardedBatchSampler(len(self._samples), cfg.batch_size, shuffle=cfg.shuffle,
                                           drop_last=cfg.drop_last, seed=cfg.seed, rank=self.rank,
                                           world_size=self.world_size)
        threads = cfg.backend == "thread"
        # A row for this process too where it loads samples itself (threads; GPU decode's fall-backs).
        consumer_row = threads or self._gpu is not None
        inflight = InFlight(self.num_workers + 1 if consumer_row else max(1, self.num_workers))
        if self._gpu is not None:
            from .gpudecode import EncodingFetcher

            fetcher = EncodingFetcher(self._samples, cfg.seed, cfg.on_error, inflight, self._gpu)
        else:
            fetcher = BatchFetcher(self._samples, cfg.seed, cfg.on_error, inflight)
        if threads:
            # On the CPU, normalize=False hands out views of the buffer itself: no reuse then.
            return ThreadSource(fetcher, self.sampler, self.num_workers, cfg.prefetch_factor,
                                pin=self.pin_memory and torch.cuda.is_available(), timeout=cfg.timeout,
                                reuse=self.device.type == "cuda" or cfg.normalize)
        return ProcessSource(fetcher, self.sampler, self._options())

    # DataLoader-style read-only attributes that training frameworks look for
    # (also dataset, num_workers, pin_memory and sampler, set in __init__).
    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def drop_last(self) -> bool:
        return self.config.drop_last

    @property
    def batch_sampler(self) -> ShardedBatchSampler | None:
        """The sampler of index batches (the same object as ``sampler``; None for a stream)."""
        return self.sampler

    @property
    def persistent_workers(self) -> bool:
        return self.config.persistent_workers

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass epoch ``epoch`` (its shuffle order and augmentation draws,
        the same on every rank). Without it each new pass advances the epoch by one.
        ``loader.sampler.set_epoch(epoch)`` (what Lightning calls) does the same.

        After ``load_state_dict``, ``set_epoch`` of the state's epoch keeps the resumed pass."""
        self._next_epoch = check_epoch(epoch)
        self._mark_sampler_epoch(self._next_epoch)
        self._position = None
        if self._plan is not None and self._plan.epoch != self._next_epoch:
            self._plan = None

    def _mark_sampler_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.epoch = self._sampler_epoch = epoch

    def _adopt_sampler_epoch(self) -> None:
        """An epoch set through ``loader.sampler.set_epoch`` since we last wrote it wins."""
        if self.sampler is not None and self.sampler.epoch != self._sampler_epoch:
            self.set_epoch(self.sampler.epoch)

    def _follow_rank(self) -> None:
        """Re-reads rank and world size that were not given; if torch.distributed was
        initialized since (e.g. by Lightning's Trainer), rebuilds the sampler and source."""
        rank, world_size = resolve_rank(self.config.rank, self.config.world_size)
        if (rank, world_size) == (self.rank, self.world_size):
            return
        self._end_pass()
        self._watchdog.stop()
        self._source.close()
        self.rank, self.world_size = rank, world_size
        epoch = self.sampler.epoch if self.sampler is not None else 0
        self._source = self._make_source()
        if self._gpu is not None:
            self._prefetcher.fetcher = self._source.fetcher
        if self.sampler is not None:
            self.sampler.epoch = epoch  # keeps an epoch set through the old sampler pending
        self._watchdog = Watchdog(self._source.inflight, None if self.streaming else self._samples,
                                  self.config.stall_warning)

    def __len__(self) -> int:
        if not self._closed:
            self._follow_rank()
        return len(self.sampler) if self.sampler is not None else len(self._source)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        if self._closed:
            raise RuntimeError("Loader is closed")
        self._end_pass()
        self._follow_rank()
        self._adopt_sampler_epoch()
        self.epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        self._mark_sampler_epoch(self.epoch)
        plan, self._plan = self._plan, None
        if plan is None:
            self._position = _Position(self.epoch)
        else:
            self._position = _Position(self.epoch, plan.history, plan.start)
        self._pass = Pass(self, self._run(self.epoch, plan, self._position))
        return self._pass

    def _host_batches(self, epoch: int, plan: resume.Plan | None) -> Iterator[HostBatch]:
        if plan is None:
            return self._source.batches(epoch)
        if self.streaming:
            return self._source.batches(epoch, start=plan.start)
        return self._source.batches(epoch, plan.requests) if plan.requests else iter(())

    def _run(self, epoch: int, plan: resume.Plan | None,
             position: _Position) -> Iterator[tuple[torch.Tensor, ...]]:
        # A generator method: the pass holds a reference to the Loader, so
        # `for x, y in Loader(...)` keeps the loader alive until the loop ends.
        outputs = self._prefetcher.run(self._observed(self._host_batches(epoch, plan)))
        try:
            for out in outputs:
                position.consumed += 1  # counted at the hand-over: what runs ahead is not consumed
                yield out
            position.done = True
        except RuntimeError as e:
            # DataLoader's SIGCHLD handler raises a worker death wherever the main thread is.
            if not is_worker_failure(e):
                raise
            restart = getattr(self._source, "restart", None)
            if restart is not None:
                restart()
            raise worker_failure(e, self._source.inflight, None if self.streaming else self._samples) from e
        finally:
            outputs.close()
            self._watchdog.arrived()

    def _observed(self, batches: Iterator[HostBatch]) -> Iterator[HostBatch]:
        while True:
            self._watchdog.waiting()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self._watchdog.arrived()
            if batch.skipped:
                self._record_skipped(batch.skipped)
            yield batch

    def _record_skipped(self, skipped: tuple[SkippedSample, ...]) -> None:
        before = self.skipped_count
        self.skipped_count += len(skipped)
        self.skipped.extend(skipped)
        del self.skipped[:-MAX_SKIPPED_KEPT]
        if before == 0 or before // SKIP_WARN_EVERY != self.skipped_count // SKIP_WARN_EVERY:
            warnings.warn(f"fastload: skipped {self.skipped_count} bad sample(s) so far (loader.skipped lists "
                          f"them); latest: {skipped[-1]}", RuntimeWarning, stacklevel=user_stacklevel())

    def _end_pass(self, by: str = "a newer pass") -> None:
        current, self._pass = self._pass, None
        if current is not None:
            current.end(by)

    def _settings(self) -> dict:
        if self._fingerprint is None:
            self._fingerprint = resume.fingerprint(self.dataset)
        size = resume.dataset_size(self.dataset) if self.sampler is None else self.sampler.num_samples
        return {**{k: getattr(self.config, k) for k in resume.SETTINGS},
                "dataset": {"len": size, "fingerprint": self._fingerprint}}

    def state_dict(self) -> dict:
        """Where this rank is: the epoch of the pass under way (or interrupted) and how many of
        its batches were handed out, or the next pass when none is under way.

        A small dict of plain values: put it in the training checkpoint (``torch.save``,
        readable with ``weights_only=True``). Every rank saves its own; no collective.
        """
        pos = self._position
        if pos is None or pos.done:
            plan = self._plan
            pos = _Position(self._next_epoch) if plan is None else _Position(plan.epoch, plan.history, plan.start)
        return resume.rank_state(epoch=pos.epoch, rank=self.rank, world_size=self.world_size, consumed=pos.consumed,
                                 history=pos.history, settings=self._settings(),
                                 num_workers=self.num_workers if self.streaming else None)

    def load_state_dict(self, state: dict | Sequence[dict]) -> None:
        """Makes the next pass go on where the run that saved ``state`` stopped.

        Args:
            state: The states of all ranks of that run (a list, in any order), one merged
                state (:func:`fastload.merge_states`), or the state of a single-rank run.
                The number of ranks, workers and the backend may differ from that run's
                (a stream needs the same ranks and workers): the samples no rank
                consumed are dealt out to this run's ranks, each exactly once (plus
                padding, as DistributedSampler pads), with equal batch counts.

        Raises:
            ValueError: The state is of another dataset (length or fingerprint), seed,
                batch size, shuffle or drop_last, or is incomplete or malformed.
        """
        merged = resume.as_merged(state)
        resume.check_matches(merged, self._settings())
        if self.streaming:
            plan = resume.stream_plan(merged, self.rank, self.world_size, self.num_workers, len(self._source))
        else:
            plan = resume.plan(merged, self.sampler.num_samples, self.rank, self.world_size)
        self._end_pass()
        self._next_epoch, self._plan, self._position = merged["epoch"], plan, None

    def stats(self) -> dict:
        """Data-wait time and share of each step, host-to-device GB/s, unpinned and skipped counts."""
        return {**self._prefetcher.stats.as_dict(), "skipped": self.skipped_count}

    def close(self) -> None:
        """Ends the current pass and stops the workers (within a few seconds, even if one
        is stuck in a sample); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._end_pass("close()")
        except RuntimeError:  # the pass runs in another thread: closing the source below ends it
            pass
        finally:
            self._watchdog.stop()
            self._source.close()
            self._prefetcher.close()

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
        size = "stream" if self.streaming else str(len(self.dataset))
        return (f"Loader({type(self.dataset).__name__}[{size}], batch_size={c.batch_size}, "
                f"num_workers={self.num_workers}, backend={c.backend!r}, device={self.device}, "
                f"rank={self.rank}/{self.world_size})")
