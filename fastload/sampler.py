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


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size) given explicitly, else from torch.distributed, else (0, 1)."""
    initialized = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} must be in [0, {world_size})")
    return rank, world_size


def check_epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return int(epoch)


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
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} must be in [0, {world_size})")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        if drop_last:
            self.per_rank = num_samples // world_size
            self.num_batches = self.per_rank // batch_size
        else:
            self.per_rank = math.ceil(num_samples / world_size)
            self.num_batches = math.ceil(self.per_rank / batch_size)
        if self.num_batches == 0:
            raise ValueError(
                f"no batch to yield: {num_samples} samples over {world_size} rank(s) is fewer than "
                f"batch_size={batch_size} with drop_last=True"
            )

    def set_epoch(self, epoch: int) -> None:
        """Epoch used when iterating the sampler itself (``requests`` takes it explicitly)."""
        self.epoch = check_epoch(epoch)

    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's indices for ``epoch`` (default: the one set), in order."""
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        n = self.num_samples
        if self.shuffle:
            order = np.random.default_rng((self.seed, epoch)).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        total = self.per_rank * self.world_size
        if total > n:
            order = np.resize(order, total)  # repeats the head, like DistributedSampler's padding
        else:
            order = order[:total]
        mine = order[self.rank : total : self.world_size]
        if self.drop_last:
            mine = mine[: self.num_batches * self.batch_size]
        return mine.astype(np.int64, copy=False)

    def requests(self, epoch: int, start: int = 0) -> Iterator[BatchRequest]:
        """This rank's batches of ``epoch``, from batch number ``start`` on."""
        mine = self.rank_indices(epoch)
        for first in range(start * self.batch_size, len(mine), self.batch_size):
            yield BatchRequest(epoch, mine[first : first + self.batch_size])

    def __iter__(self) -> Iterator[BatchRequest]:
        return self.requests(self.epoch)

    def __len__(self) -> int:
        return self.num_batches
