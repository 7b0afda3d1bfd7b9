"""Which samples each reading slot (rank × worker) reads in a pass, and in which order.

A first pass of an epoch: the shards in an order drawn from (seed, epoch), their samples
(in storage order) cut into ``num_slots`` contiguous ranges whose sizes differ by at most
one, so a slot reads a run of whole shards plus at most two partial ones; within a slot,
the samples of each window of ``window`` consecutive shards are permuted (from seed,
epoch, slot count, slot and window). Across ranks every slot then yields the same number
of samples: a short slot repeats its own first ones (as DistributedSampler pads), or with
``drop_last`` long slots stop at the shortest length. On one rank the ranges are runs of
whole batches instead, unpadded (:mod:`fastload.datasets.stream_slots`): a stage on one
rank (``world_size == 1``) lays out its slots that way.

A resumed pass (after ``history``, the stages of the epoch run before on other ranks or
workers): what no stage consumed, in the order the last stage laid it out, is cut into
contiguous ranges again, one per slot of the new pass, padded (or cut at whole batches
on one rank) in the same way. The samples a stage consumed follow from its per-rank
batch counts: DataLoader takes a rank's batches from its workers in turn, so batch ``j``
of a rank is a batch of the rank's slot ``j % workers`` (see
:func:`fastload.datasets.stream_slots.slot_batches_done`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..stream_slots import batch_count, batch_ranges

TAG_SHARDS, TAG_WINDOW = 0x5348, 0x574E  # keep these draws apart from other users of (seed, epoch)


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The shards of ``epoch`` in reading order."""
    if not shuffle:
        return np.arange(num_shards)
    return np.random.default_rng([seed, epoch, TAG_SHARDS]).permutation(num_shards)


def slot_sizes(total: int, num_slots: int, drop_last: bool) -> int:
    """The length of every slot of a pass over ``total`` samples (padded, or cut with ``drop_last``)."""
    return total // num_slots if drop_last else math.ceil(total / num_slots)


def first_pass(
    counts: np.ndarray,
    slot: int,
    num_slots: int,
    epoch: int,
    seed: int,
    shuffle: bool,
    window: int,
    bounds: tuple[int, int] | None = None,
) -> list[np.ndarray]:
    """The sample numbers slot ``slot`` reads in a first pass, one array per window (unpadded):
    its share of the epoch's order, or the positions ``bounds`` (``[lo, hi)``) of it."""
    order = shard_order(len(counts), seed, epoch, shuffle)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ends = np.cumsum(counts[order])
    starts = ends - counts[order]
    total = int(ends[-1]) if len(ends) else 0
    lo, hi = (slot * total // num_slots, (slot + 1) * total // num_slots) if bounds is None else bounds
    segments = []
    for p in range(int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(starts, hi, side="left"))):
        a, b = max(lo, int(starts[p])) - int(starts[p]), min(hi, int(ends[p])) - int(starts[p])
        if b > a:
            segments.append(firsts[order[p]] + np.arange(a, b, dtype=np.int64))
    chunks = []
    for w in range(0, len(segments), window):
        numbers = np.concatenate(segments[w : w + window])
        if shuffle:
            rng = np.random.default_rng([seed, epoch, TAG_WINDOW, num_slots, slot, w // window])
            numbers = numbers[rng.permutation(len(numbers))]
        chunks.append(numbers)
    return chunks


def fit(chunks: list[np.ndarray], length: int, fill: np.ndarray) -> list[np.ndarray]:
    """``chunks`` cut to ``length`` numbers, or padded by one more chunk cycling through their
    own numbers (through ``fill`` when they have none)."""
    n = sum(len(c) for c in chunks)
    if n < length:
        own = np.concatenate(chunks) if n else fill
        return [*chunks, np.resize(own, length - n)]
    out, left = [], length
    for c in chunks:
        if left <= 0:
            break
        out.append(c[:left])
        left -= len(out[-1])
    return out


def deal(order: np.ndarray, num_slots: int, drop_last: bool, batch_size: int | None = None) -> list[np.ndarray]:
    """``order`` cut into ``num_slots`` contiguous ranges, each fit to one length; with
    ``batch_size`` (one rank) into runs of whole batches, unpadded."""
    if batch_size is not None:
        return [order[lo:hi] for lo, hi in batch_ranges(len(order), num_slots, batch_size, drop_last)]
    total = len(order)
    length = slot_sizes(total, num_slots, drop_last)
    return [
        np.concatenate(fit([order[s * total // num_slots : (s + 1) * total // num_slots]], length, order))
        if length
        else order[:0]
        for s in range(num_slots)
    ]


def slots_of(stage: Any) -> tuple[int, int]:
    """(slots, workers per rank) of a stage (world_size, num_workers, consumed)."""
    workers = max(1, int(stage.num_workers or 0))
    return stage.world_size * workers, workers


def one_rank(stage: Any, batch_size: int) -> int | None:
    """The batch size that lays out a stage's slots when it ran on one rank, else None (padded)."""
    return batch_size if stage.world_size == 1 else None


def stage_leftover(slots: Sequence[np.ndarray], stage: Any, batch_size: int, drop_last: bool) -> np.ndarray:
    """What a pass laid out as ``slots`` still had to visit after ``stage``, in its order.

    Raises:
        ValueError: A rank consumed more batches than the pass had.
    """
    from ..stream_slots import slot_batches_done

    num_slots, workers = slots_of(stage)
    if len(slots) != num_slots or len(stage.consumed) != stage.world_size:
        raise ValueError(
            f"loader state: a stage of {stage.world_size} ranks × {workers} workers lists "
            f"{len(stage.consumed)} batch counts"
        )
    per_slot = [batch_count(len(numbers), batch_size, drop_last) for numbers in slots]
    visited, taken = [], []
    for rank, done in enumerate(stage.consumed):
        has = sum(per_slot[rank * workers : (rank + 1) * workers])
        if done > has:
            raise ValueError(
                f"loader state: rank {rank} of {stage.world_size} consumed {done} batches, but that "
                f"part of the epoch has {has}"
            )
        for local in range(workers):
            numbers = slots[rank * workers + local]
            visited.append(numbers[: per_slot[rank * workers + local] * batch_size])
            taken.append(numbers[: slot_batches_done(done, local, workers) * batch_size])
    order = np.concatenate(visited) if visited else np.zeros(0, np.int64)
    _, first = np.unique(order, return_index=True)
    order = order[np.sort(first)]  # each sample once, where it was first visited
    return order[~np.isin(order, np.concatenate(taken))]


def resumed_pass(
    counts: np.ndarray,
    num_slots: int,
    history: Sequence[Any],
    epoch: int,
    seed: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    window: int,
    whole_batches: bool = False,
) -> list[np.ndarray]:
    """Every slot's samples in the pass after ``history``: what no stage consumed, padded, or
    with ``whole_batches`` (the pass runs on one rank) in runs of whole batches."""
    total = int(np.sum(counts))
    first_slots, _ = slots_of(history[0])
    empty = np.zeros(0, np.int64)
    if one_rank(history[0], batch_size):
        bounds = batch_ranges(total, first_slots, batch_size, drop_last)
        slots = [
            np.concatenate([empty, *first_pass(counts, s, first_slots, epoch, seed, shuffle, window, bounds[s])])
            for s in range(first_slots)
        ]
    else:
        length = slot_sizes(total, first_slots, drop_last)
        slots = [
            np.concatenate(
                fit(first_pass(counts, s, first_slots, epoch, seed, shuffle, window), length, np.zeros(1, np.int64))
            )
            for s in range(first_slots)
        ]
    for k, stage in enumerate(history):
        if k:
            slots = deal(left, slots_of(stage)[0], drop_last, one_rank(stage, batch_size))
        left = stage_leftover(slots, stage, batch_size, drop_last)
    return deal(left, num_slots, drop_last, batch_size if whole_batches else None)


def by_shards(numbers: np.ndarray, shard_of: np.ndarray, window: int) -> list[np.ndarray]:
    """``numbers`` cut into consecutive chunks that each read from at most ``window`` shards."""
    chunks, start, seen = [], 0, set()
    for i, shard in enumerate(shard_of[numbers].tolist()):
        if shard not in seen and len(seen) == window:
            chunks.append(numbers[start:i])
            start, seen = i, set()
        seen.add(shard)
    if start < len(numbers):
        chunks.append(numbers[start:])
    return chunks
