"""``fl.DataLoader``: the one-line swap for ``torch.utils.data.DataLoader``, with its signature,
positional order and defaults.

``fl.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)`` means what
``torch.utils.data.DataLoader`` with the same arguments means: a keyword left out means what
it means there (batches of 1, no shuffling, no workers, workers not persistent, no pinning,
every sample read by this process). It is a :class:`fastload.Loader` built with those
meanings: batches arrive normalized on the device (fastload's own options, such as
``device=``, ``normalize=``, ``seed=`` and ``batch_transform=``, are taken as keywords too).
"""

from __future__ import annotations

from typing import Any

from .loader import Loader
from .loading import compat


class DataLoader(Loader):
    """A :class:`fastload.Loader` with ``torch.utils.data.DataLoader``'s signature, positional
    order and defaults: the drop-in.

    What fastload cannot honour (``collate_fn``, ``worker_init_fn``, ``batch_sampler``, a
    sampler other than a ``DistributedSampler``, an ``IterableDataset``, ``batch_size=None``)
    is a TypeError saying what to write instead; arguments that contradict each other are
    the ValueErrors DataLoader raises. ``in_order=False`` is taken: batches arrive in order,
    which it allows.

    Args:
        dataset: As for :class:`fastload.Loader`.
        batch_size: Samples per batch (DataLoader's default: 1).
        shuffle: Reshuffle every epoch (None: False).
        sampler: None (this process reads every sample) or a ``DistributedSampler``.
        batch_sampler: Not taken (None only).
        num_workers: Worker processes (0: samples are loaded in this process).
        collate_fn: Not taken (None only).
        pin_memory: Pin host batches before the copy to a CUDA device.
        drop_last: Drop the last incomplete batch.
        timeout: Seconds to wait for a worker's batch (0: forever).
        worker_init_fn: Not taken (None only).
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
        TypeError: A keyword fastload cannot honour (``config=`` included), or a dataset it
            cannot read.
        ValueError: A bad value, or arguments DataLoader refuses together (the message names them).
    """

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
