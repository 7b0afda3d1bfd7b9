"""DataLoader's keywords on :class:`fastload.Loader`: translated to LoaderConfig options with
DataLoader's meaning, or refused with an error that says what to write instead; and the
old spellings of fastload's grouped options (:mod:`fastload.config.spellings`).

fastload deals, orders, batches and seeds samples itself, so a keyword that would hand one
of those to user code (a custom sampler, ``collate_fn``, ``worker_init_fn``) cannot be
honoured by its batches: ``fl.Loader`` refuses it, never a silent change of order or content;
``fl.DataLoader`` (the drop-in) hands it to torch's DataLoader whole (:func:`torch_only`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from ..config import LoaderConfig, Shard
from ..config.spellings import upgrade
from ..datasets.protocols import is_stream
from ..system import user_stacklevel

# Keywords of DataLoader that LoaderConfig does not have; each is translated or refused here.
KEYWORDS = (
    "sampler",
    "batch_sampler",
    "collate_fn",
    "worker_init_fn",
    "generator",
    "pin_memory_device",
    "in_order",
)


#: DataLoader's keywords that hand batching or worker setup to the user's code, which
#: fastload's batches cannot follow; and what to write instead.
USER_CODE = {
    "batch_sampler": "fastload batches this rank's samples itself: give batch_size= and drop_last=",
    "collate_fn": "fastload collates images into one uint8 batch and targets by type itself "
    "(fastload.targets); transform each sample in the dataset, or the batch after the loader",
    "worker_init_fn": "fastload seeds numpy and random in each worker from seed= itself; do per-worker "
    "setup lazily in the dataset's load or __getitem__",
}


def torch_only(dataset: Any, arguments: dict) -> tuple[str, str] | None:
    """Why DataLoader's ``arguments`` (its keywords, by name) over ``dataset`` can be honoured
    only by torch's DataLoader itself: (what was given, what fastload would need instead); None
    when fastload can run them. A keyword that hands batching, order or worker setup to the
    user's code, no batching at all, or an IterableDataset that is not a fastload stream. A
    fastload stream never: torch's DataLoader cannot read it (fastload's refusal says what to
    write)."""
    if is_stream(dataset):
        return None
    for keyword, instead in USER_CODE.items():
        if arguments.get(keyword) is not None:
            return f"{keyword}={_short(arguments[keyword])}", instead
    if "batch_size" in arguments and arguments["batch_size"] is None:
        return "batch_size=None (no batching)", "give batch_size= (samples per batch)"
    sampler = arguments.get("sampler")
    if sampler is not None and not (
        isinstance(sampler, DistributedSampler) and type(sampler).__iter__ is DistributedSampler.__iter__
    ):
        return f"sampler={_short(sampler)}", _sampler_advice(sampler)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return (
            f"{type(dataset).__name__}, an IterableDataset",
            "give a dataset with random access (__len__ and __getitem__), or a fastload stream such as TFRecordStream",
        )
    return None


def yields_nothing(dataset: Any, arguments: dict) -> bool:
    """Whether DataLoader's ``arguments`` over map-style ``dataset`` make no batch at all: an
    empty dataset, or fewer samples per rank than ``batch_size`` with ``drop_last``. DataLoader
    then yields nothing, where a Loader refuses (a run that trains on nothing is a mistake
    it names)."""
    if is_stream(dataset) or not isinstance(dataset, Sized) or isinstance(arguments.get("num_workers"), str):
        return False  # num_workers="auto" is fastload's own: its Loader says what is wrong
    sampler = arguments.get("sampler")
    # DataLoader's own count: a DistributedSampler pads its ranks (or drops the uneven tail)
    try:
        per_rank = len(sampler) if isinstance(sampler, DistributedSampler) else len(dataset)
    except TypeError:  # a len() that fails: the Loader says so
        return False
    batch_size = arguments.get("batch_size") or 1
    return (per_rank // batch_size if arguments.get("drop_last") else per_rank) == 0


def torch_arguments(arguments: dict) -> dict:
    """DataLoader's keyword ``arguments`` for ``torch.utils.data.DataLoader``, those newer than
    the oldest torch fastload supports left out where they hold their default
    (``in_order``: torch 2.6)."""
    return {k: v for k, v in arguments.items() if not (k == "in_order" and v is True)}


@dataclass(frozen=True)
class Translated:
    """What the Loader's keywords mean.

    Attributes:
        options: LoaderConfig fields.
        distributed: The DistributedSampler given, whose ``set_epoch`` the Loader follows.
        generator: Where a seed not given is drawn from (None: torch's default generator).
    """

    options: dict
    distributed: DistributedSampler | None = None
    generator: torch.Generator | None = None


def _short(value: Any) -> str:
    """``value`` as the user wrote it, near enough: ``RandomSampler(...)`` rather than its address."""
    if value is None or isinstance(value, (str, int, float, list, tuple)):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    return getattr(value, "__qualname__", None) or f"{type(value).__name__}(...)"


def _refuse(keyword: str, value: Any, instead: str, where: str = "fl.Loader") -> TypeError:
    return TypeError(f"{where} does not take {keyword}={_short(value)}: {instead}")


def _sampler_advice(sampler: Any) -> str:
    name = type(sampler).__name__
    if isinstance(sampler, torch.utils.data.SequentialSampler):
        return "leave sampler out (shuffle=False, the default, visits the samples in order)"
    if (
        isinstance(sampler, torch.utils.data.RandomSampler)
        and not sampler.replacement
        and sampler.num_samples == len(sampler.data_source)
    ):
        return (
            "write shuffle=True (each epoch a new order, from seed= or, without it, from torch's "
            "generator as RandomSampler does)"
        )
    if isinstance(sampler, torch.utils.data.SubsetRandomSampler):
        return "write fl.Loader(torch.utils.data.Subset(dataset, indices), shuffle=True)"
    if isinstance(sampler, DistributedSampler):
        return (
            f"{name} overrides DistributedSampler's order, which fastload cannot follow; pass a plain "
            "DistributedSampler, or shard=fl.Shard(rank=, world_size=, drop_uneven=), shuffle= and seed="
        )
    return (
        f"fastload orders and deals the samples itself, so {name}'s order cannot be followed; express it "
        "with shuffle=, seed= and shard=fl.Shard(rank=, world_size=, drop_uneven=) (DDP shards), or reorder the "
        "dataset with torch.utils.data.Subset(dataset, indices) (repeat indices to weight samples)"
    )


def _distributed(sampler: DistributedSampler, options: dict, base: LoaderConfig, dataset: Any) -> dict:
    """LoaderConfig options that deal the samples as ``sampler`` does."""
    if isinstance(dataset, Sized) and len(sampler.dataset) != len(dataset):
        raise ValueError(
            f"the DistributedSampler is over a dataset of {len(sampler.dataset)} samples, the "
            f"Loader's has {len(dataset)}: give both the same dataset"
        )
    if options.get("shuffle"):
        raise ValueError(
            f"sampler option is mutually exclusive with shuffle (as in DataLoader), got "
            f"sampler={type(sampler).__name__}(...) and shuffle=True: the sampler shuffles (its shuffle=, "
            "default True); write shuffle=(sampler is None)"
        )
    taken = Shard(
        rank=sampler.rank,
        world_size=sampler.num_replicas,
        drop_uneven=bool(sampler.drop_last),
        shuffle_seed=int(sampler.seed),
    )
    given = _shard(options, base)
    for name in ("rank", "world_size", "shuffle_seed", "drop_uneven"):
        mine, theirs = getattr(given, name), getattr(taken, name)
        unset = mine is None or (name == "drop_uneven" and mine is False)
        if not unset and mine != theirs:
            raise ValueError(
                f"shard's {name}={mine!r} disagrees with the DistributedSampler's {theirs!r}: "
                f"leave it out (the sampler sets it)"
            )
    return {"shard": taken, "shuffle": bool(sampler.shuffle)}


def _shard(options: dict, base: LoaderConfig) -> Shard:
    """The shard ``options`` give, else ``base``'s."""
    return Shard.of(options["shard"]) if "shard" in options else base.shard


def translate(options: dict, base: LoaderConfig, dataset: Any, where: str = "fl.Loader") -> Translated:
    """The LoaderConfig options, DistributedSampler and seed generator that ``options``
    (the Loader's keywords, DataLoader's included) mean, on top of ``base``; ``where``: the
    call, for the messages (``fl.Loader``, ``fl.DataLoader``).

    Raises:
        TypeError: A keyword fastload cannot honour (the message says what to write).
        ValueError: Keywords that contradict each other.
    """
    # (+ 1: upgrade warns from a frame below this one)
    groups = {"normalize": base.normalize, "shard": base.shard}
    options = upgrade(dict(options), groups, where, user_stacklevel() + 1)
    extra = {k: options.pop(k) for k in KEYWORDS if k in options}
    if options.get("shuffle", False) is None:
        del options["shuffle"]  # DataLoader's default: no shuffling
    if "prefetch_factor" in options and options["prefetch_factor"] is None:
        del options["prefetch_factor"]  # DataLoader's default
    if "batch_size" in options and options["batch_size"] is None:
        raise _refuse("batch_size", None, "fastload always batches; give batch_size= (samples per batch)", where)
    for keyword, instead in USER_CODE.items():
        if extra.get(keyword) is not None:
            raise _refuse(keyword, extra[keyword], instead, where)
    if extra.get("pin_memory_device"):
        raise _refuse(
            "pin_memory_device",
            extra["pin_memory_device"],
            f"batches arrive on the device itself: write device={extra['pin_memory_device']!r}",
            where,
        )
    generator = extra.get("generator")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise _refuse(
                "generator",
                generator,
                "give a torch.Generator (it seeds the shuffle order and the augmentation, as in DataLoader) or seed=",
                where,
            )
        if options.get("seed") is not None:
            raise ValueError("seed= and generator= both given: give one (generator= draws the seed)")
    distributed = None
    if "sampler" in extra:
        sampler = extra["sampler"]
        if sampler is None:
            # DataLoader's meaning: this process reads the whole dataset.
            shard = _shard(options, base)
            if shard.rank is None and shard.world_size is None:
                options["shard"] = dataclasses.replace(shard, rank=0, world_size=1)
        elif isinstance(sampler, DistributedSampler) and type(sampler).__iter__ is DistributedSampler.__iter__:
            options.update(_distributed(sampler, options, base, dataset))
            distributed = sampler
        else:
            raise _refuse("sampler", sampler, _sampler_advice(sampler), where)
    return Translated(options, distributed, generator)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A seed drawn as DataLoader draws its base seed: an int64 >= 0 from ``generator``
    (torch's default generator when None, so ``torch.manual_seed`` sets it)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def order_seed(cfg: LoaderConfig, drawn: bool, world_size: int) -> int:
    """The seed of the shuffle order: ``shuffle_seed``, else ``seed``; but 0 (as
    DistributedSampler's default) where ``world_size`` ranks shard the data with a seed
    each drew from its own generator: they must all deal the same order."""
    if cfg.shard.shuffle_seed is not None:
        return cfg.shard.shuffle_seed
    return 0 if drawn and world_size > 1 else cfg.seed


def resolve_seed(cfg: LoaderConfig, generator: torch.Generator | None = None) -> tuple[LoaderConfig, bool]:
    """``cfg`` with its seed drawn if it has none; and whether it was drawn."""
    if cfg.seed is not None:
        return cfg, False
    return cfg.replace(seed=draw_seed(generator)), True


def _set_refused(owner: Any, name: str, value: Any) -> None:
    """DataLoader's refusal to set ``name`` after construction, as a ValueError naming the value."""
    kind = type(owner).__name__
    raise ValueError(
        f"{name} attribute should not be set after {kind} is initialized (got {name}={_short(value)}): "
        f"make a new {kind} with {name}=..."
    )


class DataLoaderAttributes:
    """DataLoader's attributes that training frameworks look for, read-only: set after
    construction, each is refused with a ValueError. DataLoader refuses ``dataset``,
    ``batch_size``, ``sampler``, ``batch_sampler``, ``drop_last`` and ``persistent_workers``
    too; it applies ``num_workers``, ``pin_memory``, ``timeout``, ``prefetch_factor`` and
    ``multiprocessing_context`` at the next ``iter()``, where a Loader's workers start with
    it, so a value set would silently not be used."""

    config: LoaderConfig
    _source: Any
    _dataset: Any
    _sampler: Any
    _num_workers: int
    _pin_memory: bool

    @property
    def num_workers(self) -> int:
        """Worker processes or threads (``"auto"`` resolved)."""
        return self._num_workers

    @num_workers.setter
    def num_workers(self, value: Any) -> None:
        _set_refused(self, "num_workers", value)

    @property
    def pin_memory(self) -> bool:
        """Whether host batches are pinned before the copy to the device."""
        return self._pin_memory

    @pin_memory.setter
    def pin_memory(self, value: Any) -> None:
        _set_refused(self, "pin_memory", value)

    @property
    def timeout(self) -> float:
        """Seconds to wait for a batch (0: forever)."""
        return self.config.timeout

    @timeout.setter
    def timeout(self, value: Any) -> None:
        _set_refused(self, "timeout", value)

    @property
    def prefetch_factor(self) -> int | None:
        """Batches prepared ahead per worker (None without workers, as DataLoader's)."""
        return self.config.prefetch_factor if self._num_workers else None

    @prefetch_factor.setter
    def prefetch_factor(self, value: Any) -> None:
        _set_refused(self, "prefetch_factor", value)

    @property
    def multiprocessing_context(self) -> Any:
        """The workers' start method as given (None: the platform's)."""
        return self.config.multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, value: Any) -> None:
        _set_refused(self, "multiprocessing_context", value)

    @property
    def dataset(self) -> Any:
        """The dataset as given."""
        return self._dataset

    @dataset.setter
    def dataset(self, value: Any) -> None:
        _set_refused(self, "dataset", value)

    @property
    def sampler(self) -> Any:
        """This rank's samples (``len()``, ``set_epoch``), as DataLoader's; None for a stream."""
        return self._sampler

    @sampler.setter
    def sampler(self, value: Any) -> None:
        _set_refused(self, "sampler", value)

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        _set_refused(self, "batch_size", value)

    @property
    def drop_last(self) -> bool:
        return self.config.drop_last

    @drop_last.setter
    def drop_last(self, value: Any) -> None:
        _set_refused(self, "drop_last", value)

    @property
    def batch_sampler(self) -> Any:
        """This rank's index batches (``len()``: batches per epoch); None for a stream."""
        return self._source.sampler

    @batch_sampler.setter
    def batch_sampler(self, value: Any) -> None:
        _set_refused(self, "batch_sampler", value)

    @property
    def persistent_workers(self) -> bool:
        return self.config.persistent_workers

    @persistent_workers.setter
    def persistent_workers(self, value: Any) -> None:
        _set_refused(self, "persistent_workers", value)


#: DataLoader's parameters after ``dataset`` that may be given by position, in its order.
POSITIONAL = (
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
)


def positional(args: tuple, options: dict, where: str = "fl.Loader") -> dict:
    """``options`` with the positional arguments after the dataset named, in DataLoader's order
    (``fl.Loader(ds, 64, True)`` is ``batch_size=64, shuffle=True``).

    Raises:
        TypeError: More positional arguments than DataLoader takes, or one also given by keyword.
    """
    if len(args) > len(POSITIONAL):
        raise TypeError(
            f"{where} takes at most {len(POSITIONAL) + 1} positional arguments (dataset, "
            f"{', '.join(POSITIONAL)}), got {len(args) + 1}: give the rest by keyword"
        )
    named = dict(options)
    for name, value in zip(POSITIONAL, args):
        if name in named:
            raise TypeError(f"{where} got multiple values for argument {name!r} (by position and by keyword)")
        named[name] = value
    return named


def _is_iter_datapipe(dataset: Any) -> bool:
    try:
        from torch.utils.data.datapipes.datapipe import IterDataPipe
    except ImportError:  # a torch without datapipes
        return False
    return isinstance(dataset, IterDataPipe)


def check_combinations(
    dataset: Any,
    *,
    batch_size: Any,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    num_workers: Any,
    drop_last: Any,
    timeout: Any = 0,
    prefetch_factor: Any,
    persistent_workers: Any,
    multiprocessing_context: Any,
) -> None:
    """DataLoader's checks of its arguments, in its order, as ValueErrors that begin with
    DataLoader's own words (so its messages, searched for, still lead somewhere) and go on
    to name the values given and what to write.

    Raises:
        ValueError: What DataLoader refuses.
    """
    number = (int, float, np.integer, np.floating)
    if isinstance(num_workers, number) and not isinstance(num_workers, bool) and num_workers < 0:
        raise ValueError(
            f"num_workers option should be non-negative (as in DataLoader), got num_workers={num_workers!r}: "
            "num_workers=0 loads in this process"
        )
    if isinstance(timeout, number) and not isinstance(timeout, bool) and timeout < 0:
        raise ValueError(
            f"timeout option should be non-negative (as in DataLoader), got timeout={timeout!r}: "
            "seconds to wait for a batch, 0 waits for ever"
        )
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            f"prefetch_factor={prefetch_factor!r} needs num_workers > 0 (as in DataLoader), got num_workers=0: "
            "leave prefetch_factor out, or give num_workers"
        )
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers=True needs num_workers > 0 (as in DataLoader), got num_workers=0")
    if multiprocessing_context is not None and num_workers == 0:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading (num_workers > 0), but got "
            f"num_workers=0 (as in DataLoader), with multiprocessing_context={_short(multiprocessing_context)}"
        )
    if isinstance(dataset, torch.utils.data.IterableDataset):
        for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
            # A datapipe takes shuffle= (DataLoader sets its shuffler with it).
            if value not in (None, False) and not (name == "shuffle" and _is_iter_datapipe(dataset)):
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified {name} option, but got "
                    f"{name}={_short(value)}: an IterableDataset orders itself"
                )
    if sampler is not None and shuffle:
        raise ValueError(
            f"sampler option is mutually exclusive with shuffle (as in DataLoader), got sampler={_short(sampler)} "
            f"and shuffle={shuffle!r}: the sampler orders the samples; write shuffle=(sampler is None)"
        )
    if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
        given = {"batch_size": batch_size, "shuffle": shuffle, "sampler": sampler, "drop_last": drop_last}
        clash = ", ".join(
            f"{k}={_short(v)}"
            for k, v in given.items()
            if (k == "batch_size" and v != 1) or (k == "sampler" and v is not None) or (k != "batch_size" and v)
        )
        raise ValueError(
            f"batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last "
            f"(as in DataLoader), got {clash}"
        )
    if batch_size is None and drop_last:
        raise ValueError(
            "batch_size=None option disables auto-batching and is mutually exclusive with drop_last (as in "
            "DataLoader), got drop_last=True: without batching there is no last batch to drop"
        )
