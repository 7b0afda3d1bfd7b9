"""Batches of indices for one rank, with DistributedSampler's semantics.

Each batch request carries its epoch and seed, so workers (persistent or not, in any process)
derive augmentation randomness from (seed, epoch, index) without being told about set_epoch.
The epoch a sampler reports is its :class:`EpochClock`'s: the Loader's progress, which owns it.
``loader.batch_sampler`` is a :class:`ShardedBatchSampler` (its ``len()`` counts batches);
``loader.sampler`` is a :class:`RankSampler` over it (its ``len()`` counts this rank's
samples, as DataLoader's sampler does).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch.distributed as dist

from ..config import check_rank
from .request import BatchRequest, batched


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size) given explicitly, else from torch.distributed, else (0, 1)."""
    initialized = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    check_rank(rank, world_size)
    return rank, world_size


def check_epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return int(epoch)


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Every sample of ``epoch`` in visiting order: a permutation from (seed, epoch), or 0..n-1."""
    if shuffle:
        return np.random.default_rng((seed, epoch)).permutation(num_samples).astype(np.int64, copy=False)
    return np.arange(num_samples, dtype=np.int64)


def rank_count(
    num_samples: int, world_size: int, batch_size: int, drop_last: bool, drop_uneven: bool = False
) -> tuple[int, int]:
    """(samples, batches) each rank gets when ``num_samples`` are dealt out (see :func:`deal`)."""
    if drop_last:
        num_batches = num_samples // world_size // batch_size
        return num_batches * batch_size, num_batches
    per_rank = num_samples // world_size if drop_uneven else math.ceil(num_samples / world_size)
    return per_rank, math.ceil(per_rank / batch_size)


def deal(
    order: np.ndarray,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    pad: np.ndarray | None = None,
    drop_uneven: bool = False,
) -> np.ndarray:
    """Rank ``rank``'s share of ``order``: every ``world_size``-th sample from position ``rank``.

    By default ``order`` is first padded to a multiple of ``world_size`` by cycling
    through ``pad`` (default: ``order`` itself, i.e. repeating its head, as
    DistributedSampler does). ``drop_uneven`` (DistributedSampler's ``drop_last``) drops
    the tail that does not divide evenly instead; ``drop_last`` also keeps whole batches
    only.
    """
    n = len(order)
    per_rank, _ = rank_count(n, world_size, batch_size, drop_last, drop_uneven)
    total = per_rank * world_size
    if total > n:
        order = np.concatenate([order, np.resize(order if pad is None else pad, total - n)])
    return order[rank:total:world_size].astype(np.int64, copy=False)


class EpochClock(Protocol):
    """Where a sampler reads and sets its epoch: the Loader's progress
    (:class:`fastload.loading.progress.Progress`), which owns it; a sampler of its own holds one."""

    @property
    def shown(self) -> int:
        """The epoch a sampler reports (of the pass under way, or the next one)."""

    def request(self, epoch: int) -> None:
        """A sampler's ``set_epoch(epoch)``."""


class OwnEpoch:
    """The epoch of a sampler used on its own (no Loader)."""

    def __init__(self) -> None:
        self.shown = 0

    def request(self, epoch: int) -> None:
        self.shown = epoch


class ShardedBatchSampler:
    """Yields this rank's batches; every rank yields the same number of batches.

    By default the permutation is padded by repeating its head until it divides evenly
    among ranks (as DistributedSampler does); ``drop_uneven`` (DistributedSampler's
    ``drop_last``) drops the tail that does not divide evenly instead, keeping each
    rank's last incomplete batch. ``drop_last`` drops that tail and each rank's last
    incomplete batch.

    Args:
        num_samples: Dataset length.
        batch_size: Samples per batch.
        shuffle: Permute from (seed, epoch); otherwise in order.
        drop_last: See above.
        seed: Seed of the shuffle order, identical on every rank.
        rank: This rank.
        world_size: Number of ranks.
        drop_uneven: See above.
        epochs: Where the epoch is kept (the Loader's progress); default: the sampler's own.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_uneven: bool = False,
        epochs: EpochClock | None = None,
    ) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.drop_uneven = drop_uneven
        self._epochs: EpochClock = OwnEpoch() if epochs is None else epochs
        self._deal(seed, rank, world_size)

    def _deal(self, seed: int, rank: int, world_size: int) -> None:
        """This rank's share of the order of ``seed``: its sample and batch counts, checked."""
        check_rank(rank, world_size)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        n, drop_last = self.num_samples, self.drop_last
        self.per_rank, self.num_batches = rank_count(n, world_size, self.batch_size, drop_last, self.drop_uneven)
        if self.num_batches == 0:
            why = "with drop_last=True" if drop_last else "with DistributedSampler's drop_last=True (drop_uneven)"
            raise ValueError(
                f"no batch to yield: {n} samples over {world_size} rank(s) is fewer than "
                f"{'batch_size=' + str(self.batch_size) if drop_last else 'one sample per rank'} {why}"
            )

    def resharded(self, rank: int, world_size: int, seed: int) -> ShardedBatchSampler:
        """This sampler for another rank, world size or order seed (its epoch kept where it is)."""
        new = copy.copy(self)
        new._deal(seed, rank, world_size)
        return new

    @property
    def epoch(self) -> int:
        """The epoch set (on a Loader's sampler: of its pass under way, or its next one)."""
        return self._epochs.shown

    def set_epoch(self, epoch: int) -> None:
        """Epoch used when iterating the sampler itself (``requests`` takes it explicitly);
        on a Loader's sampler, also the epoch of the Loader's next pass."""
        self._epochs.request(check_epoch(epoch))

    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's indices for ``epoch`` (default: the one set), in order."""
        return self._dealt(epoch, self.drop_last)

    def shard(self, epoch: int | None = None) -> np.ndarray:
        """This rank's samples of ``epoch`` (default: the one set) before batching: with
        ``drop_last``, also those of its last incomplete batch (DataLoader's sampler)."""
        return self._dealt(epoch, False)

    def _dealt(self, epoch: int | None, drop_last: bool) -> np.ndarray:
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        # Batches of one: drop_last then only drops the uneven tail across ranks.
        batch_size = self.batch_size if drop_last else 1
        return deal(
            order, self.rank, self.world_size, batch_size, drop_last, drop_uneven=self.drop_uneven or self.drop_last
        )

    def requests(self, epoch: int, seed: int = 0) -> Iterator[BatchRequest]:
        """This rank's batches of ``epoch``, their draws from ``seed``."""
        return batched(epoch, self.rank_indices(epoch), self.batch_size, seed=seed, rank=self.rank)

    def __iter__(self) -> Iterator[BatchRequest]:
        return self.requests(self.epoch)

    def __len__(self) -> int:
        return self.num_batches


class RankSampler:
    """``loader.sampler``: this rank's samples, as DataLoader's sampler (a DistributedSampler's
    ``len()`` and ``set_epoch``); the batches are ``loader.batch_sampler``'s.

    Iterating it yields the sample indices of the epoch last set (the Loader's next pass
    until it starts, then its current one).
    """

    def __init__(self, batches: ShardedBatchSampler) -> None:
        self.batch_sampler = batches

    @property
    def epoch(self) -> int:
        return self.batch_sampler.epoch

    @property
    def rank(self) -> int:
        return self.batch_sampler.rank

    @property
    def num_replicas(self) -> int:
        """The world size (DistributedSampler's name for it)."""
        return self.batch_sampler.world_size

    @property
    def shuffle(self) -> bool:
        return self.batch_sampler.shuffle

    @property
    def seed(self) -> int:
        return self.batch_sampler.seed

    def set_epoch(self, epoch: int) -> None:
        """Makes the Loader's next pass epoch ``epoch`` (like ``loader.set_epoch``)."""
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(self.batch_sampler.shard().tolist())

    def __len__(self) -> int:
        b = self.batch_sampler
        return rank_count(b.num_samples, b.world_size, 1, False, b.drop_uneven or b.drop_last)[0]
