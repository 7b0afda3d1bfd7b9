"""fastload.Loader: the epoch counter, a batch source, and the device stage."""

from __future__ import annotations

import dataclasses
import os
import types
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch

from .augment.apply import BatchTransforms
from .batch import SkippedSample
from .config import DEVICE_AHEAD, LoaderConfig, resolve_device
from .datasets.protocols import Loadable, RecordStream
from .datasets.subset import SubsetDataset
from .datasets.wrap import WrappedDataset
from .device.copy import HostCopy
from .device.driver import DeviceDriver, Executor, Output, Stats
from .device.normalize import Normalizer
from .loading import compat
from .loading.compat import DataLoaderAttributes
from .loading.passes import Pass, Raised, fork_safe_threads, register
from .loading.profiles import resolve_auto
from .loading.progress import Position, Progress
from .loading.skips import SkipLog
from .sources import SourceBatch, build_source, is_stream, resume
from .sources.build import pin_memory
from .sources.failures import PassClosed, WorkerFailure, WorkersReplaced, is_worker_failure, worker_failure
from .sources.request import After, PassRequest
from .sources.sampler import RankSampler, resolve_rank
from .sources.start import refuse_while_bootstrapping
from .sources.watchdog import Watchdog

_NOT_GIVEN: Any = object()  # a Loader made without a dataset


class Loader(DataLoaderAttributes):
    """Batches of normalized images on a device, from a fastload dataset or your own.

    Each pass over the loader is a new epoch (new shuffle order and augmentation draws):
    the first pass is epoch 0, the next 1, and so on; ``set_epoch(e)`` makes the next
    pass epoch ``e``. Starting a pass ends an unfinished earlier one. A Loader that goes
    out of scope stops its workers at once; ``close()`` (or ``with``) does it explicitly.
    A batch whose loading fails raises from ``next()`` in its turn (the dataset's error, of
    its own type); the next ``next()`` goes on with the batch after it, as DataLoader's
    iterator does (a stream's pass ends there).

    Rank and world size not given are read from torch.distributed when it is
    initialized, also when that happens after construction (as Lightning's Trainer does):
    the next pass (or ``len``) then shards by rank.

    ``state_dict()`` says where the loader is in an epoch; ``load_state_dict`` on a new
    Loader (same dataset, seed, batch size; any ranks, workers or backend) makes its next
    pass hand out exactly the batches that would have come next.

    Decoding is strict (a damaged JPEG raises, or is skipped with ``on_error="skip"``);
    bytes verified strictly before (``fastload verify``, a converter's ``--verify``) whose
    checksum still matches may take a cheaper region decode, and bytes that changed since are
    refused (``ChangedSinceVerifiedError``). ``decode="gpu"`` is not
    strict: nvImageCodec (nvJPEG) decodes corrupt data without an error, and crops as
    regions whatever ``FASTLOAD_ROI`` says, so a damaged file can reach a batch as wrong
    pixels. Use it on data known to be intact (converted with ``--verify``), or keep
    ``decode="cpu"``.

    Args:
        dataset: A fastload dataset (``ImageFolder``, ``LMDBDataset``, ...), anything
            with ``__len__`` and ``load(index, epoch, seed) -> (HWC uint8, target)``, a
            stream (``TFRecordStream``), or a map-style dataset of your own (``__len__`` and
            ``__getitem__``), wrapped in :class:`~fastload.WrappedDataset`; by position or
            ``dataset=``, as in DataLoader.
        *args: DataLoader's positional arguments after the dataset, in its order
            (``batch_size``, ``shuffle``, ``sampler``, ...), with the meanings below; or a
            LoaderConfig (``fl.Loader(dataset, config)``).
        config: A LoaderConfig to start from (the tuner writes these).
        batch_transform: A callable ``f(images, targets, generator) -> (images, targets)``
            or a list of them, applied in order to each normalized batch on ``device`` as
            it is handed out (e.g. ``[fl.augment.Mixup(0.8, 1.0),
            fl.augment.RandomErasing(0.25, mode="pixel")]``: timm's order, mix then erase);
            ``generator`` is a torch.Generator on the batch's device seeded from (seed, epoch,
            rank, batch number, position in the list), so the draws do not depend on workers,
            backend or resuming. Not a LoaderConfig field (configs are saved by the tuner;
            code is not); see :mod:`fastload.augment`.
        **options: LoaderConfig fields overriding ``config``, e.g. ``batch_size=256``, and
            DataLoader's keywords with DataLoader's meaning where fastload can honour them
            (``sampler=None`` or a ``DistributedSampler``, ``multiprocessing_context``,
            ``generator``; see :mod:`fastload.loading.compat`).

    Yields:
        (images, targets): images N×C×H×W in channels_last memory on ``loader.device``,
        normalized float (or uint8 with ``normalize=False``); targets int64 N for int
        labels, else float32 N or N×... (see :mod:`fastload.targets`). With
        ``return_index=True``: (images, targets, indices), indices int64 on the CPU.
        With ``batch_transform``, images and targets as the last transform returns them
        (``fl.augment.Mixup``: float32 N × num_classes soft targets).

    Omitted options take fastload's defaults (:class:`~fastload.LoaderConfig`: batches of
    256, workers from the tuner or the CPUs, persistent); :class:`fastload.DataLoader` takes
    DataLoader's signature and defaults instead.

    Raises:
        TypeError: Unknown option, or a dataset fastload cannot read (the message says why).
        ValueError: A bad option value (the message names it).
    """

    #: ``fl.Loader[T]`` in annotations, as ``DataLoader[T]``.
    __class_getitem__ = classmethod(types.GenericAlias)

    #: A user's dataset whose first item is no image raises ItemsNotImages (where it is read,
    #: in a worker or here) rather than its sample's TypeError: fl.DataLoader then runs it as
    #: torch's DataLoader.
    _first_item_decides: ClassVar[bool] = False

    def __init__(
        self,
        dataset: Any = _NOT_GIVEN,
        *args: Any,
        config: LoaderConfig | None = None,
        batch_transform: Any = None,
        **options: Any,
    ) -> None:
        where = f"fl.{type(self).__name__}"  # for the messages
        if dataset is _NOT_GIVEN:
            raise TypeError(f"{where} needs a dataset: {where}(dataset, batch_size=...) or dataset=...")
        if args and isinstance(args[0], LoaderConfig):
            if config is not None:
                raise TypeError(f"{where} got two configs, by position and config=: give one")
            config, args = args[0], args[1:]
            if args:
                raise TypeError(
                    f"{where}(dataset, config, ...) takes the options after the config by keyword: "
                    f"write {where}(dataset, config, batch_size=..., ...)"
                )
        options = compat.positional(args, options, where)
        if config is not None and not isinstance(config, LoaderConfig):
            raise TypeError(f"config must be a LoaderConfig, got {type(config).__name__}")
        self._closed = True  # until construction succeeds (for __del__)
        self._batch_transforms = BatchTransforms.of(batch_transform)
        samples = dataset
        if not isinstance(dataset, (RecordStream, Loadable)):
            samples = SubsetDataset.of(dataset) or WrappedDataset(dataset, first_item_decides=self._first_item_decides)
            samples.given = dataset  # what get_worker_info().dataset is in a worker
        if not is_stream(samples) and len(samples) == 0:
            raise ValueError("dataset is empty")
        self._dataset = dataset  # as given (DataLoader's attribute)
        self._samples = samples  # what the workers load: the dataset, or its SubsetDataset or WrappedDataset
        base = config or LoaderConfig()
        keywords = compat.translate(options, base, samples, where)
        cfg, self.profile = resolve_auto(base.replace(**keywords.options), keywords.options, samples)
        cfg, self._seed_drawn = compat.resolve_seed(cfg, keywords.generator)
        self.config = cfg
        self.device = resolve_device(cfg.device)
        # A GPU not named by index is this process's, re-read at each pass (see _follow_device).
        unindexed = cfg.device is None or torch.device(cfg.device).index is None
        self._device_follows = self.device.type == "cuda" and unindexed
        self.rank, self.world_size = resolve_rank(cfg.shard.rank, cfg.shard.world_size)
        self._num_workers = int(cfg.num_workers)
        self._pin_memory = pin_memory(cfg.pin_memory, self.device)
        self._skips = SkipLog()
        self.skipped: list[SkippedSample] = self._skips.items  # what on_error="skip" replaced (the latest 10,000)
        self._gpu = None  # the GPU decode pipeline (decode="gpu")
        self._share = None  # the share of its rows the workers decode on the CPU (gpu_cpu_share)
        if cfg.decode == "gpu":
            from .device.gpudecode import check_setup
            from .device.gpudecode.share import CpuShare

            self._gpu = check_setup(samples, self.device, cfg.backend)
            self._share = CpuShare(cfg.gpu_cpu_share, self.num_workers)  # kept across source rebuilds
        self._normalizer = Normalizer.of(cfg.normalize)
        self._stats = Stats()  # the device drivers' counters, kept across source rebuilds
        # The epoch, also as loader.sampler / batch_sampler and the DistributedSampler given set it.
        self._progress = Progress(keywords.distributed)
        # Weak: the pass holds the Loader (so `for x in Loader(...)` works); a strong reference
        # back would make a cycle that keeps a dropped Loader and its workers alive until gc runs.
        self._pass_ref: weakref.ref[Pass] | None = None
        self._fingerprint: str | None = None
        # Last: workers and threads start here, and nothing after can fail and leave them running.
        self._attach_source()
        self._closed = False
        register(self)

    @property
    def skipped_count(self) -> int:
        """Samples skipped so far (``on_error="skip"``), each counted once per pass."""
        return self._skips.count

    @property
    def epoch(self) -> int | None:
        """The epoch of the current (or last) pass; None before the first."""
        return self._progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass epoch ``epoch`` (its shuffle order and augmentation draws,
        the same on every rank). Without it each new pass advances the epoch by one.
        ``loader.sampler.set_epoch(epoch)`` (what Lightning calls) does the same.

        After ``load_state_dict``, ``set_epoch`` of the state's epoch keeps the resumed pass;
        another epoch drops it, with a warning."""
        self._progress.set_epoch(epoch)

    def _adopt_sampler_epoch(self) -> None:
        """An epoch set through a sampler since the last pass (or ``set_epoch``) wins, also
        the current one: ``loader.sampler.set_epoch`` or a given DistributedSampler's."""
        requested = self._progress.take_request()
        if requested is not None:
            self.set_epoch(requested)

    def _attach_source(self) -> None:
        """A source (and samplers) for the current device, rank, world size and seeds."""
        cfg = self.config
        # With decode="gpu" workers read bytes and draw crops; the device stage decodes.
        # The process that made the source (its workers, threads, buffers): a forked child
        # that inherits this object builds its own at its first pass and never stops the parent's.
        self._pid = os.getpid()
        self._source = build_source(
            self._samples,
            cfg,
            self.rank,
            self.world_size,
            self.device,
            order_seed=compat.order_seed(cfg, self._seed_drawn, self.world_size),
            epochs=self._progress,
            gpu=self._gpu,
            cpu_share=self._share.current if self._share is not None else None,
        )
        executor: Executor = HostCopy()
        if self._gpu is not None and self._share is not None:
            from .device.gpudecode import GpuDecode
            from .device.gpudecode.share import SharedDecode

            # The source's row loader loads what the GPU decoder refuses; the skip log (not the
            # Loader: no cycle) hears of what those loads replaced. The share counts the rows
            # (and, "auto", times them).
            executor = SharedDecode(GpuDecode(self._source.loader, self._skips.record), self._share)
        self._driver = DeviceDriver(
            executor, self.device, DEVICE_AHEAD, self._normalizer, cfg.return_index, stats=self._stats
        )
        self._show_sampler()
        self._watchdog = Watchdog(self._source.inflight, self._source.dataset, cfg.stall_warning)

    def _show_sampler(self) -> None:
        # DataLoader's sampler: this rank's samples (len), set_epoch; None for a stream.
        self._sampler = RankSampler(self._source.sampler) if self._source.sampler is not None else None

    def _reshard(self) -> None:
        """This rank's share dealt anew for a changed rank, world size or order seed: the
        workers stay (each request carries what fixes its batch)."""
        self._adopt_sampler_epoch()
        self._end_pass()
        order = compat.order_seed(self.config, self._seed_drawn, self.world_size)
        self._source.reshard(self.rank, self.world_size, order)
        self._show_sampler()

    def _rebuild_source(self) -> None:
        """A new source and device driver for a changed device (an epoch asked for stays pending)."""
        self._adopt_sampler_epoch()
        self._end_pass()
        if not self._inherited():  # a parent's source is kept as it is (see _forked)
            self._watchdog.stop()
            self._source.close()
            self._driver.close()
        self._attach_source()

    def _inherited(self) -> bool:
        """The source (workers, threads, buffers) is a parent process's: this is a forked copy."""
        return self._pid != os.getpid()

    def _forked(self) -> list:
        """Called in a forked child (``loading.passes``): the source and the pass under way are
        the parent's. Returns them, to be kept untouched; a ``next()`` on that pass raises,
        and the next pass here builds a source of this process's own."""
        current = self._pass_ref() if self._pass_ref is not None else None
        self._pass_ref = None
        batches = current.disowned(self._pid) if current is not None else None
        return [self._source, self._watchdog, self._driver, batches]

    def _follow_rank(self) -> None:
        """Re-reads rank and world size that were not given; if torch.distributed was
        initialized since (e.g. by Lightning's Trainer), rebuilds the source."""
        rank, world_size = resolve_rank(self.config.shard.rank, self.config.shard.world_size)
        if (rank, world_size) != (self.rank, self.world_size):
            self.rank, self.world_size = rank, world_size
            self._reshard()

    def _follow_device(self) -> None:
        """An unindexed CUDA device follows the process's GPU: Lightning and torchrun scripts
        may build the Loader before ``torch.cuda.set_device`` (issue 26, item 1)."""
        if self._device_follows:
            device = resolve_device(self.config.device)
            if device != self.device:
                self.device = device
                self._rebuild_source()  # its host buffers are pinned for the device

    def _follow_length(self) -> None:
        """A map-style dataset whose length changed since the source was built (one that grows
        between passes) gets a source for its new length, as DataLoader's ``len`` and passes
        follow ``len(dataset)``: new workers, which see the dataset as it is now."""
        if is_stream(self._samples) or self._inherited():
            return
        n = len(self._samples)
        if n != self._source.num_samples:
            if n == 0:
                raise ValueError("dataset is empty (it had samples when the Loader was made)")
            self._fingerprint = None
            self._rebuild_source()

    def _pipeline_changed(self) -> bool:
        """``decode="gpu"`` runs the dataset's transforms on the device as they were when its
        device pipeline was made: whether ones set otherwise since (``ds.transform =
        train(160)``, progressive resizing, on any runner; a new pipeline set alike is no
        change) replaced it, for a new source whose workers plan by them.

        Raises:
            ValueError: The new transforms are not ones GPU decode can run (the message says which).
        """
        if self._gpu is None:
            return False
        from .datasets.changes import same_settings
        from .device.gpudecode import check_setup

        now = check_setup(self._samples, self.device, self.config.backend)
        if same_settings(now, self._gpu):
            return False
        self._gpu = now
        return True

    def __len__(self) -> int:
        """Batches of the next pass on this rank (a resumed epoch's rest after ``load_state_dict``)."""
        if not self._closed:
            self._follow_length()
            self._follow_rank()
        return self._progress.next_pass_length(len(self._source))

    def __iter__(self) -> Iterator[Output]:
        if self._closed:
            raise RuntimeError("Loader is closed")
        refuse_while_bootstrapping()  # an unguarded script, re-imported by a spawned worker
        self._end_pass()
        fork_safe_threads()  # in a forked process: torch's thread pool is the parent's
        # A forked process's first pass: workers, threads and buffers of its own; a new device
        # pipeline: a source whose workers plan by it (one rebuild for both).
        if self._pipeline_changed() | self._inherited():
            self._rebuild_source()
        self._follow_length()
        self._follow_rank()
        self._follow_device()
        self._adopt_sampler_epoch()
        position, resumed = self._progress.start_pass()
        self._skips.new_pass()
        run = PassRequest(position.epoch, self.config.seed, position.batch_number(self.rank, self.world_size), resumed)
        current = Pass(self, self._run(position, run))
        self._pass_ref = weakref.ref(current)
        return current

    def _run(self, position: Position, run: PassRequest) -> Iterator[Output | Raised]:
        # A generator method: the pass holds a reference to the Loader, so
        # `for x, y in Loader(...)` keeps the loader alive until the loop ends.
        source = self._source
        finish = None
        if self._batch_transforms is not None:
            transforms = self._batch_transforms

            def finish(out: Output) -> Output:
                number = position.batch_number(self.rank, self.world_size)
                return transforms.apply(out, seed=self.config.seed, epoch=position.epoch, rank=self.rank, batch=number)

        first, start = run, position.consumed
        while True:
            outputs = self._driver.run(self._observed(source.batches(run)), finish)
            try:
                for out in outputs:
                    position.consumed += 1  # counted at the hand-over: what runs ahead is not consumed
                    yield out
                position.done = True
                return
            except Exception as e:
                if isinstance(e, RuntimeError) and is_worker_failure(e):
                    source.restart()
                    raise worker_failure(e, source.inflight, source.dataset) from e
                if not self._goes_on_after(e, source):
                    raise
                failed = e
            finally:
                outputs.close()
                self._watchdog.arrived()
            # A batch's error (the dataset's own, of its type): DataLoader raises it in the batch's
            # turn and its iterator goes on with the next batch. The batch counts as handed out;
            # the rest of the pass runs as requests made again, on the same workers if persistent.
            position.consumed += 1
            yield Raised(failed)
            del failed  # its traceback holds the frames of the batches that ended
            number = position.batch_number(self.rank, self.world_size)
            run = PassRequest(run.epoch, run.seed, number, After(first, position.consumed - start))

    def _goes_on_after(self, error: Exception, source: Any) -> bool:
        """Whether the pass goes on after ``error``: a batch's error, not a worker's death or
        timeout (``WorkerFailure``), the warning of new workers made an error
        (``WorkersReplaced``), nor the Loader closed; and an indexed source, whose pass can be
        made again from any batch (a stream's cannot: its pass ends)."""
        return (
            not isinstance(error, (WorkerFailure, WorkersReplaced))  # made an error: not a batch's
            and not self._closed
            and not isinstance(error, PassClosed)
            and source.replays
        )

    def _observed(self, batches: Iterator[SourceBatch]) -> Iterator[SourceBatch]:
        while True:
            self._watchdog.waiting()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self._watchdog.arrived()
            if batch.skipped:
                self._skips.record(batch.skipped)
            yield batch

    def _end_pass(self, by: str = "a newer pass") -> None:
        ref, self._pass_ref = self._pass_ref, None
        current = ref() if ref is not None else None
        if current is not None:
            current.end(by)

    def _settings(self) -> dict:
        if self._fingerprint is None:
            self._fingerprint = resume.fingerprint(self._samples)
        c = self.config
        values = {
            "seed": c.seed,
            "shuffle_seed": compat.order_seed(c, self._seed_drawn, self.world_size),
            "batch_size": c.batch_size,
            "shuffle": c.shuffle,
            "drop_last": c.drop_last,
            "drop_uneven": c.shard.drop_uneven,
        }
        return {
            **{k: values[k] for k in resume.SETTINGS},
            "dataset": {"len": self._source.num_samples, "fingerprint": self._fingerprint},
        }

    def state_dict(self) -> dict:
        """Where this rank is: the epoch of the pass under way (or interrupted) and how many of
        its batches were handed out, or the next pass when none is under way.

        A small dict of plain values: put it in the training checkpoint (``torch.save``,
        readable with ``weights_only=True``). Every rank saves its own; no collective.
        """
        pos = self._progress.where()
        return resume.rank_state(
            epoch=pos.epoch,
            rank=self.rank,
            world_size=self.world_size,
            consumed=pos.consumed,
            history=pos.history,
            settings=self._settings(),
            **self._source.state_fields(),
        )

    def load_state_dict(self, state: dict | Sequence[dict]) -> None:
        """Makes the next pass go on where the run that saved ``state`` stopped.

        Args:
            state: The states of all ranks of that run (a list, in any order), one merged
                state (:func:`fastload.merge_states`), or the state of a single-rank run.
                The number of ranks, workers and the backend may differ from that run's
                (a TFRecordStream needs the same ranks and workers): the samples no rank
                consumed are dealt out to this run's ranks, each exactly once (plus
                padding, as DistributedSampler pads), with equal batch counts.

        Raises:
            ValueError: The state is of another dataset (length or fingerprint), seed,
                batch size, shuffle, drop_last or drop_uneven, or is incomplete or malformed.
        """
        merged = resume.for_rank(resume.as_merged(state), self.rank)
        if self._seed_drawn:  # the saved run's draws win: the resumed pass repeats its order and crops
            shard = self.config.shard
            seeds = resume.seeds(merged, keep_order_seed=shard.shuffle_seed)
            if seeds != (self.config.seed, shard.shuffle_seed):
                shard = dataclasses.replace(shard, shuffle_seed=seeds[1])
                self.config = self.config.replace(seed=seeds[0], shard=shard)
                self._reshard()  # the order may change; the seed travels with each request
        resume.check_matches(merged, self._settings())
        resumed = self._source.resume_point(merged)
        self._end_pass()
        self._progress.resume(merged["epoch"], resumed)

    def stats(self) -> dict:
        """Data-wait time and share of each step, host-to-device GB/s, unpinned and skipped counts;
        with ``decode="gpu"``, the rows the GPU decoded and those the workers decoded for
        ``gpu_cpu_share``, and the share now (:class:`~fastload.device.gpudecode.share.CpuShare`)."""
        share = self._share.as_dict() if self._share is not None else {}
        return {**self._stats.as_dict(), "skipped": self._skips.count, **share}

    def close(self) -> None:
        """Ends the current pass and stops the workers (within a few seconds, even if one
        is stuck in a sample); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._inherited():
            return  # a copy inherited by a forked process: the workers are the parent's to stop
        try:
            self._end_pass("close()")
        except RuntimeError:  # the pass runs in another thread: closing the source below ends it
            pass
        finally:
            self._watchdog.stop()
            self._source.close()
            self._driver.close()

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
        size = "stream" if is_stream(self._samples) else str(len(self._samples))
        return (
            f"{type(self).__name__}({type(self.dataset).__name__}[{size}], batch_size={c.batch_size}, "
            f"num_workers={self.num_workers}, backend={c.backend!r}, device={self.device}, "
            f"rank={self.rank}/{self.world_size})"
        )
