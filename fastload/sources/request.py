"""What crosses from the Loader to a batch source: a pass, and the requests it is cut into.

A :class:`BatchRequest` says everything that fixes a batch: its epoch, the seed of its draws,
the rank and its number in the epoch, and its samples (dataset indices; a stream's batch
plan takes its rows from its reading slot's records as they are read,
:class:`fastload.sources.slots.StreamMaker`). Workers hold no seed, epoch or rank of their own, so changing
the seed or the rank starts no new workers: the next requests simply carry the new values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class BatchRequest:
    """One batch to make.

    Attributes:
        epoch: The epoch of its draws (and of its shuffle order).
        indices: int64 dataset indices of its rows (none for a stream batch: its plan's rows
            are its records).
        seed: The seed of its augmentation draws: sample i draws from (seed, epoch, i).
        rank: The rank it is made for.
        number: Its number among this rank's batches of the epoch.
        cpu_share: ``decode="gpu"``: the share of its GPU-decodable rows the worker decodes on
            the CPU (the first ``round(cpu_share * R)`` of its R such rows, in batch order;
            :class:`fastload.sources.packed.PackMaker`). Set as the request is sent, so a
            changed share needs no new workers.
    """

    epoch: int
    indices: np.ndarray
    seed: int = 0
    rank: int = 0
    number: int = 0
    cpu_share: float = 0.0

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class PassRequest:
    """One pass of a batch source: its epoch, the seed of its draws, the number of its first
    batch in the epoch, and where it resumes an interrupted epoch (None: from its start)."""

    epoch: int
    seed: int
    first: int = 0
    resumed: Any = None  # a fastload.sources.resume.IndexedResume or StreamResume


@dataclass(frozen=True)
class After:
    """The rest of pass ``run`` after its first ``done`` batches (one whose loading failed
    counted): what the pass goes on with after a batch's error, as DataLoader's iterator goes
    on. As a :attr:`PassRequest.resumed`."""

    run: PassRequest
    done: int


def batched(
    epoch: int, indices: np.ndarray, batch_size: int, *, seed: int = 0, rank: int = 0, first: int = 0
) -> Iterator[BatchRequest]:
    """``indices`` cut into requests of ``batch_size`` (the last may be short), numbered from ``first``."""
    for k, start in enumerate(range(0, len(indices), batch_size)):
        yield BatchRequest(epoch, indices[start : start + batch_size], seed, rank, first + k)
