"""``fl.DataLoader``: the one-line swap for ``torch.utils.data.DataLoader``, with its signature,
positional order and defaults.

``fl.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)`` means what
``torch.utils.data.DataLoader`` with the same arguments means: a keyword left out means what
it means there (batches of 1, no shuffling, no workers, workers not persistent, no pinning,
every sample read by this process). It is a :class:`fastload.Loader` built with those
meanings: batches arrive normalized on the device (fastload's own options, such as
``device=``, ``normalize=``, ``seed=`` and ``batch_transform=``, are taken as keywords too).

Given what hands batching, order or worker setup to the user's code (``collate_fn``,
``worker_init_fn``, ``batch_sampler``, a sampler other than a ``DistributedSampler``,
``batch_size=None``), or an ``IterableDataset`` that is not a fastload stream,
``fl.DataLoader(...)`` is ``torch.utils.data.DataLoader(...)`` itself, with a ``RuntimeWarning``
that nothing of fastload runs and what its loader would need instead.

A map-style dataset that makes no batch at all by DataLoader's count (empty, or fewer samples
per rank than ``batch_size`` with ``drop_last``) is ``torch.utils.data.DataLoader(...)`` too
(:class:`NoBatches`: with the Loader's ``with``, ``close()`` and ``set_epoch()``), without a
warning: it yields nothing, as there (``fl.Loader``, or fastload's own options and
``num_workers="auto"``, name it as a ValueError instead).

A dataset whose items are not images (numbers, strings, vectors: the first item's first
field is none, nor a sequence of them), or whose images fastload does not take as they are
(float pixels, C×H×W arrays: a ``RuntimeWarning`` says so), has nothing for fastload to
decode: with ``on_error="raise"`` (DataLoader's meaning) it runs as
``torch.utils.data.DataLoader`` with the same arguments (:attr:`DataLoader.generic`). That is
decided by the first pass, where the items are read: the first item a worker (or, with no
workers or with threads, this process) reads, when it is such an item, raises
:class:`~fastload.datasets.wrap.ItemsNotImages` there (a damaged image: None, bytes, uint8
pixels in no image's shape, is its sample's error instead); met before the pass's first batch,
the pass goes on as torch's DataLoader (from the batch after those whose errors it raised),
and every later pass is torch's. Nothing reads an item beforehand, so a dataset whose items
wait for each other (a barrier across the workers) runs as with DataLoader; the items read
before the switch are read again, by torch's DataLoader. With ``on_error="skip"`` (fastload's
option) such an item is skipped as a damaged sample is, so data that is not images fails
there, naming its samples.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import torch

from .datasets.wrap import ItemsNotImages
from .loader import Loader
from .loading import compat


class NoBatches(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` over a dataset that makes no batch (what ``fl.DataLoader``
    is then), with the Loader's context manager, ``close()`` and ``set_epoch()`` (nothing to do)."""

    def __enter__(self) -> NoBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to stop: no worker ever starts for a pass of no batch."""

    def set_epoch(self, epoch: int) -> None:
        """Nothing to select: every epoch is empty."""


class DataLoader(Loader):
    """A :class:`fastload.Loader` with ``torch.utils.data.DataLoader``'s signature, positional
    order and defaults: the drop-in.

    What only torch's DataLoader can honour (``collate_fn``, ``worker_init_fn``,
    ``batch_sampler``, a sampler other than a ``DistributedSampler``, ``batch_size=None``, an
    ``IterableDataset`` that is not a fastload stream) makes ``fl.DataLoader(...)`` return
    ``torch.utils.data.DataLoader`` with the same arguments, with a ``RuntimeWarning`` naming
    it and what fastload's loader would need instead; beside fastload's own options it is a
    TypeError (and for a subclass of this class, fastload's refusal as ``fl.Loader``'s). Arguments
    that contradict each other are the ValueErrors DataLoader raises. ``in_order=False`` is
    taken: fastload's batches arrive in order, which it allows.

    Args:
        dataset: As for :class:`fastload.Loader`.
        batch_size: Samples per batch (DataLoader's default: 1).
        shuffle: Reshuffle every epoch (None: False).
        sampler: None (this process reads every sample) or a ``DistributedSampler``
            (another: torch's DataLoader).
        batch_sampler: None (another: torch's DataLoader).
        num_workers: Worker processes (0: samples are loaded in this process).
        collate_fn: None (another: torch's DataLoader).
        pin_memory: Pin host batches before the copy to a CUDA device.
        drop_last: Drop the last incomplete batch.
        timeout: Seconds to wait for a worker's batch (0: forever).
        worker_init_fn: None (another: torch's DataLoader).
        multiprocessing_context: The workers' start method (needs ``num_workers > 0``).
        generator: A torch.Generator the seed is drawn from (else torch's default one).
        prefetch_factor: Batches prepared ahead per worker (None: 2; needs ``num_workers > 0``).
        persistent_workers: Keep workers alive between epochs (needs ``num_workers > 0``).
        pin_memory_device: Not taken ("" only): write ``device=``.
        in_order: Taken; batches always arrive in order.
        **options: fastload's own options (:class:`~fastload.LoaderConfig` fields such as
            ``device``, ``normalize``, ``seed``, ``on_error``; ``batch_transform``). Not
            ``config=``: DataLoader's defaults would override its values; write
            ``fl.Loader(ds, config=...)``.

    Raises:
        TypeError: ``config=``; fastload's own options beside what only torch's DataLoader
            honours; a dataset fastload cannot read.
        ValueError: A bad value, or arguments DataLoader refuses together (the message names them).
    """

    _first_item_decides: ClassVar[bool] = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # What only torch's DataLoader can honour is handed to it whole: the same object
        # DataLoader(...) would be, and a warning that nothing of fastload runs. Not for a
        # subclass (torch's object would lose what it adds: fastload's refusal says what to
        # write), nor with config= (__init__ refuses it).
        if cls is not DataLoader or "config" in kwargs:
            return super().__new__(cls)
        try:
            bound = inspect.signature(DataLoader.__init__).bind(None, *args, **kwargs)
        except TypeError:
            return super().__new__(cls)  # __init__ raises it, in its words
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments["self"]
        options, dataset = arguments.pop("options"), arguments.pop("dataset")
        reason = compat.torch_only(dataset, arguments)
        nothing = reason is None and not options and compat.yields_nothing(dataset, arguments)
        if reason is None and not nothing:
            return super().__new__(cls)
        checked = inspect.signature(compat.check_combinations).parameters
        compat.check_combinations(dataset, **{k: arguments[k] for k in checked if k != "dataset"})
        if nothing:  # as DataLoader: no batch, where a Loader refuses (there is nothing to speed up)
            return NoBatches(dataset, **compat.torch_arguments(arguments))
        assert reason is not None
        given, instead = reason
        if options:
            raise TypeError(
                f"fl.DataLoader given {given} is torch.utils.data.DataLoader, which takes none of fastload's "
                f"options ({', '.join(f'{k}=' for k in sorted(options))}): leave them out; or, for fastload's "
                f"loader: {instead}"
            )
        warnings.warn(
            f"fl.DataLoader given {given} runs as torch.utils.data.DataLoader: nothing of fastload runs "
            f"(for fastload's loader: {instead})",
            RuntimeWarning,
            stacklevel=2,
        )
        return torch.utils.data.DataLoader(dataset, **compat.torch_arguments(arguments))

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        **options: Any,
    ) -> None:
        if "config" in options:
            # Every keyword above has DataLoader's default, applied over the config's values.
            raise TypeError(
                "fl.DataLoader does not take config=: its DataLoader defaults (batch_size=1, "
                "num_workers=0, ...) would replace the config's values; use fl.Loader(ds, config=...)"
            )
        # DataLoader's own arguments, for a dataset whose items are not images (see generic).
        self._torch_arguments = dict(
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            in_order=in_order,
        )
        self._generic: torch.utils.data.DataLoader | None = None
        self._own_options = sorted(options)  # fastload's: torch's DataLoader has none of them
        self._decided = False
        # The Loader draws its seed from ``generator`` now; DataLoader draws at each pass: the
        # generic path gives the generator back as it was, if nothing drew from it since.
        self._generator_before = generator.get_state() if isinstance(generator, torch.Generator) else None
        compat.check_combinations(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            drop_last=drop_last,
            timeout=timeout,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            multiprocessing_context=multiprocessing_context,
        )
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            **options,
        )
        self._generator_after = generator.get_state() if isinstance(generator, torch.Generator) else None

    @property
    def generic(self) -> torch.utils.data.DataLoader | None:
        """``torch.utils.data.DataLoader`` with this loader's arguments once a pass found the
        dataset's items are not images; None before, and for images."""
        return self._generic

    def close(self) -> None:
        """As :meth:`fastload.Loader.close`; for data that runs as torch's DataLoader, lets it go
        (its persistent workers stop), and the loader is closed to iteration as fastload's is."""
        self._generic = None
        super().close()

    def __iter__(self) -> Iterator[Any]:
        if self._generic is not None:
            return iter(self._generic)
        images = super().__iter__()
        return images if self._decided else _FirstPass(self, images)

    def __len__(self) -> int:
        # The same count either way (batch_size, drop_last and the sampler are DataLoader's).
        return len(self._generic) if self._generic is not None else super().__len__()

    def _not_images(self, found: ItemsNotImages) -> Iterator[Any]:
        """Called when the first pass ``found`` items that are not images: closes fastload's side
        (its pass, workers, persistent ones too, and buffers) and returns a pass of torch's
        DataLoader with this loader's arguments, which serves every pass from now on. Says so
        where that is not what the user may expect: images fastload cannot take as they are
        (a ``ToTensor()`` dataset's floats: torch's DataLoader runs them, without fastload's
        speed), or fastload's own options given (torch's DataLoader has none of them)."""
        super().close()  # fastload's side; torch's DataLoader goes with close()
        if found.images or self._own_options:
            unused = ", ".join(f"{name}=" for name in self._own_options)
            warnings.warn(
                f"fl.DataLoader runs {type(self.dataset).__name__} as torch.utils.data.DataLoader with "
                f"the same arguments, as its items are not uint8 images ({found})"
                + (f"; fastload's own options do not apply there: {unused}" if unused else ""),
                RuntimeWarning,
                stacklevel=3,  # the loop that iterates the loader
            )
        generator = self._torch_arguments["generator"]
        before, after = self._generator_before, self._generator_after
        if before is not None and after is not None and torch.equal(generator.get_state(), after):
            generator.set_state(before)
        self._generic = torch.utils.data.DataLoader(self.dataset, **compat.torch_arguments(self._torch_arguments))
        self._decided = True
        return iter(self._generic)


class _FirstPass:
    """The first pass of a :class:`DataLoader`: fastload's, until its first batch shows the items
    are images; torch DataLoader's once the items read (in the workers, or here with none) show
    they are not, from the batch after those whose errors it raised. A batch's error other than
    that is raised in its turn, as from any pass, and the next ``next()`` goes on."""

    def __init__(self, owner: DataLoader, images: Iterator[Any]) -> None:
        self._owner, self._batches = owner, images
        self._raised = 0  # batches whose error was raised before the items were known

    def __iter__(self) -> _FirstPass:
        return self

    def __next__(self) -> Any:
        if self._owner._decided:
            return next(self._batches)
        try:
            batch = next(self._batches)
        except StopIteration:
            raise
        except ItemsNotImages as error:
            # Its traceback holds fastload's pass and this frame (which will hold torch's
            # iterator): dropped, so the loader is freed as soon as it is dropped. Freed by a later
            # gc cycle instead, torch's iterator would find its queues closed and wait 5 s per
            # persistent worker for them to stop.
            error.__traceback__ = None
            found = error
        except Exception:
            self._raised += 1
            raise
        else:
            self._owner._decided = True
            return batch
        self._batches = self._owner._not_images(found)
        # The pass goes on after the batches whose errors were raised: torch's DataLoader meets
        # them again (and what it raises for them was raised already).
        for _ in range(self._raised):
            try:
                next(self._batches)
            except StopIteration:
                break
            except Exception:
                pass
        return next(self._batches)
