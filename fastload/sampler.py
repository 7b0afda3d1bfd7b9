"""Batches of indices for one rank, with DistributedSampler's semantics.

Each batch carries its epoch, so workers (persistent or not, in any process) derive
augmentation randomness from (seed, epoch, index) without being told about set_epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch.distributed as dist


class BatchRequest(NamedTuple):
    epoch: int
    indices: np.ndarray  # int64


def check_rank(rank: int, world_size: int) -> None:
    """ValueError unless 0 <= rank < world_size."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} must be in [0, {world_size})")


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


def rank_count(num_samples: int, world_size: int, batch_size: int, drop_last: bool) -> tuple[int, int]:
    """(samples, batches) each rank gets when ``num_samples`` are dealt out (see :func:`deal`)."""
    if drop_last:
        num_batches = num_samples // world_size // batch_size
        return num_batches * batch_size, num_batches
    per_rank = math.ceil(num_samples / world_size)
    return per_rank, math.ceil(per_rank / batch_size)


def deal(order: np.ndarray, rank: int, world_size: int, batch_size: int, drop_last: bool,
         pad: np.ndarray | None = None) -> np.ndarray:
    """Rank ``rank``'s share of ``order``: every ``world_size``-th sample from position ``rank``.

    Without ``drop_last``, ``order`` is first padded to a multiple of ``world_size`` by
    cycling through ``pad`` (default: ``order`` itself, i.e. repeating its head, as
    DistributedSampler does); with it, each rank keeps whole batches only, from the
    samples that divide evenly.
    """
    n = len(order)
    per_rank, _ = rank_count(n, world_size, batch_size, drop_last)
    total = per_rank * world_size
    if total > n:
        order = np.concatenate([order, np.resize(order if pad is None else pad, total - n)])
    return order[rank:total:world_size].astype(np.int64, copy=False)


def batched(epoch: int, indices: np.ndarray, batch_size: int, start: int = 0) -> Iterator[BatchRequest]:
    """``indices`` cut into requests of ``batch_size`` (the last may be short), from batch ``start`` on."""
    for first in range(start * batch_size, len(indices), batch_size):
        yield BatchRequest(epoch, indices[first : first + batch_size])


class ShardedBatchSampler:
    """Yields this rank's batches; every rank yields the same number of batches.

    Without ``drop_last`` the permutation is padded by repeating its head until it
    divides evenly among ranks (as DistributedSampler does); with it, the tail that
    does not divide evenly is dropped and so is each rank's last incomplete batch.

    Args:
        num_samples: Dataset length.
        batch_size: Samples per batch.
        shuffle: Permute from (seed, epoch); otherwise in order.
        drop_last: See above.
        seed: Base seed, identical on every rank.
        rank: This rank.
        world_size: Number of ranks.
    """

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        check_rank(rank, world_size)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.set_epoch_calls = 0  # the Loader adopts an epoch set here, even the current one
        self.per_rank, self.num_batches = rank_count(num_samples, world_size, batch_size, drop_last)
        if self.num_batches == 0:
            raise ValueError(
                f"no batch to yield: {num_samples} samples over {world_size} rank(s) is fewer than "
                f"batch_size={batch_size} with drop_last=True"
            )

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next pass of the Loader that owns this sampler (and of iterating the
        sampler itself; ``requests`` takes it explicitly)."""
        self.epoch = check_epoch(epoch)
        self.set_epoch_calls += 1

    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's indices for ``epoch`` (default: the one set), in order."""
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        return deal(order, self.rank, self.world_size, self.batch_size, self.drop_last)

    def requests(self, epoch: int, start: int = 0) -> Iterator[BatchRequest]:
        """This rank's batches of ``epoch``, from batch number ``start`` on."""
        return batched(epoch, self.rank_indices(epoch), self.batch_size, start)

    def __iter__(self) -> Iterator[BatchRequest]:
        return self.requests(self.epoch)

    def __len__(self) -> int:
        return self.num_batches
