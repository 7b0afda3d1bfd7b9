"""Loader checkpoints: where a run stopped in an epoch, and how to go on from there on any number of ranks.

An epoch's order is a function of (seed, epoch) and each rank's share of it a function of
(world size, rank), so the number of batches each rank handed to the user says exactly
which samples were consumed: a state is a few integers, and no sample is read to save or
to resume. Resuming deals the samples that no rank consumed, in epoch order, out to the
new ranks (padding or dropping as the sampler does) for one pass; the next epoch is a
normal one. On an unchanged world size this is each rank's own remaining batches.

An epoch interrupted more than once is a list of :class:`Stage` s, each applied to what the
ones before it left; a rank's state carries the earlier ones as ``history``.

State keys (plain Python values, safe for ``torch.load(weights_only=True)``):

- ``version``; ``epoch``: the interrupted pass, or the next one when none is under way;
- ``world_size``; ``rank`` and ``consumed`` (batches of ``epoch`` this rank handed to the
  user), or, merged over all ranks (:func:`merge_states`), ``consumed`` per rank;
- ``history``: earlier stages of this epoch, ``[{"world_size", "consumed": [...]}]``;
- ``seed`` (augmentation; drawn from torch's generator when the Loader was given none),
  ``shuffle_seed`` (the order's: a DistributedSampler's seed, else ``seed``), ``batch_size``,
  ``shuffle``, ``drop_last``, ``drop_uneven``; ``dataset``: ``{"len", "fingerprint"}``
  (states saved before ``shuffle_seed`` and ``drop_uneven`` existed read as ``seed`` and False);
- streams only: ``num_workers`` (with the world size it lays out the reading slots; history
  entries of streams carry their own).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from ..datasets.protocols import Describes, Fingerprinted, is_stream, name_of
from ..datasets.subset import SubsetDataset
from ..datasets.wrap import WrappedDataset
from .request import BatchRequest, batched
from .sampler import deal, epoch_order, rank_count

VERSION = 1
SETTINGS = ("seed", "shuffle_seed", "batch_size", "shuffle", "drop_last", "drop_uneven")
ADDED = ("shuffle_seed", "drop_uneven")  # settings older states lack (see with_defaults)
FINGERPRINT_SAMPLES = 16


@dataclass(frozen=True)
class Stage:
    """Part of an epoch run on ``world_size`` ranks, rank r handing out ``consumed[r]`` batches
    (streams: with ``num_workers`` workers per rank, which lay out their reading slots)."""

    world_size: int
    consumed: tuple[int, ...]
    num_workers: int | None = None

    def as_dict(self) -> dict:
        out = {"world_size": self.world_size, "consumed": list(self.consumed)}
        if self.num_workers is not None:
            out["num_workers"] = self.num_workers
        return out

    def continued_by(self, world_size: int, num_workers: int | None) -> bool:
        """Whether a stage on ``world_size`` ranks (× ``num_workers``) simply goes on with this
        one: the same layout, and every rank stopped at the same batch."""
        return self.world_size == world_size and self.num_workers == num_workers and len(set(self.consumed)) == 1


@dataclass(frozen=True)
class IndexedResume:
    """The rest of an interrupted epoch of an indexed dataset, for one rank.

    Attributes:
        epoch: The interrupted epoch.
        history: The stages that consumed part of it.
        indices: This rank's samples in the resumed pass, in order.
        batch_size: Cuts them into batches (the last may be short).
    """

    epoch: int
    history: tuple[Stage, ...]
    indices: np.ndarray
    batch_size: int

    start = 0  # the pass's first batch is batch 0 of its own stage

    def length(self, full: int) -> int:
        """Batches of the resumed pass (``full``: of a whole epoch, unused here)."""
        return -(-len(self.indices) // self.batch_size)

    def requests(self, seed: int, rank: int, first: int = 0) -> Iterator[BatchRequest]:
        """The pass's batch requests, their draws from ``seed``, numbered from ``first``."""
        return batched(self.epoch, self.indices, self.batch_size, seed=seed, rank=rank, first=first)


@dataclass(frozen=True)
class StreamResume:
    """The rest of an interrupted epoch of a stream, for one rank.

    Attributes:
        epoch: The interrupted epoch.
        history: Earlier stages of it on other ranks or workers, which an elastic stream re-deals.
        start: This rank's batches already handed out in the last stage, which it goes on with.
        remaining: This rank's batches of a pass resumed after ``history`` (None: ``full - start``).
    """

    epoch: int
    history: tuple[Stage, ...] = ()
    start: int = 0
    remaining: int | None = None

    def length(self, full: int) -> int:
        """Batches of the resumed pass, of an epoch of ``full`` batches."""
        return self.remaining if self.remaining is not None else max(0, full - self.start)


#: Where the next pass starts after a state was loaded.
ResumePoint = Union[IndexedResume, StreamResume]


def remaining(
    order: np.ndarray, stages: Sequence[Stage], batch_size: int, drop_last: bool, drop_uneven: bool = False
) -> np.ndarray:
    """The samples of an epoch (``order``, in visiting order) that none of ``stages`` consumed
    and that the epoch would still visit (``drop_last`` and ``drop_uneven`` leave a tail
    out), in epoch order.

    Each stage lays out what the ones before it left as :func:`~fastload.sources.sampler.deal`
    does (padding from the epoch's head); a consumed padding repeat consumes its sample.

    Raises:
        ValueError: A rank consumed more batches than its stage had.
    """
    left = order
    for stage in stages:
        n, world_size = len(left), stage.world_size
        per_rank, num_batches = rank_count(n, world_size, batch_size, drop_last, drop_uneven)
        total = per_rank * world_size
        laid = np.concatenate([left, np.resize(order, total - n)]) if total > n else left[:total]
        taken = []
        for rank, batches in enumerate(stage.consumed):
            if batches > num_batches:
                raise ValueError(
                    f"loader state: rank {rank} of {world_size} consumed {batches} batches, "
                    f"but that part of the epoch has {num_batches}"
                )
            taken.append(laid[rank:total:world_size][: batches * batch_size])
        left = laid[: min(n, total)]  # dropping, the tail that no rank visits is left out
        left = left[~np.isin(left, np.concatenate(taken))]
    return left


def resumed_indices(
    order: np.ndarray,
    stages: Sequence[Stage],
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    drop_uneven: bool = False,
) -> np.ndarray:
    """Rank ``rank`` of ``world_size``'s samples in the resumed pass: the unconsumed samples in
    epoch order, dealt out with equal counts (padded from the epoch's head, or dropped)."""
    left = remaining(order, stages, batch_size, drop_last, drop_uneven)
    return deal(left, rank, world_size, batch_size, drop_last, pad=order, drop_uneven=drop_uneven)


def compact(stages: Sequence[Stage]) -> tuple[Stage, ...]:
    """Equivalent, shorter stages: none that consumed nothing, and a stage run on the world
    size of the one before, which consumed as much on every rank, folded into it (each rank
    then simply went on with its own batches)."""
    out: list[Stage] = []
    for stage in stages:
        if not any(stage.consumed):
            continue
        last = out[-1] if out else None
        if last is not None and last.continued_by(stage.world_size, stage.num_workers):
            out[-1] = Stage(stage.world_size, tuple(last.consumed[0] + c for c in stage.consumed), stage.num_workers)
        else:
            out.append(stage)
    return tuple(out)


def rank_state(
    *,
    epoch: int,
    rank: int,
    world_size: int,
    consumed: int,
    history: Sequence[Stage] = (),
    settings: dict,
    num_workers: int | None = None,
) -> dict:
    """One rank's state (see the module docstring); ``settings`` holds SETTINGS and ``dataset``."""
    history = list(history)
    if history and history[-1].continued_by(world_size, num_workers):
        consumed += history.pop().consumed[0]  # the same as this rank going on with its own batches
    state = {
        "version": VERSION,
        "epoch": epoch,
        "rank": rank,
        "world_size": world_size,
        "consumed": consumed,
        "history": [s.as_dict() for s in history],
        **{k: settings[k] for k in SETTINGS},
        "dataset": dict(settings["dataset"]),
    }
    if num_workers is not None:
        state["num_workers"] = num_workers
    return state


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"loader state: {what} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _ints(value: Any, count: int, what: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise ValueError(f"loader state: {what} must list {count} values, one per rank, got {value!r}")
    return tuple(_int(v, what) for v in value)


def _check_shape(state: Any) -> None:
    if not isinstance(state, dict):
        raise TypeError(f"a loader state is a dict (from Loader.state_dict()), got {type(state).__name__}")
    if state.get("version") != VERSION:
        raise ValueError(f"loader state version {state.get('version')!r} is not {VERSION} (another fastload?)")
    missing = [
        k
        for k in ("epoch", "world_size", "consumed", "history", *SETTINGS, "dataset")
        if k not in state and k not in ADDED
    ]
    if missing:
        raise ValueError(f"loader state lacks {missing}")
    _int(state["epoch"], "epoch")
    _int(state["world_size"], "world_size", 1)


def merge_states(states: Sequence[dict]) -> dict:
    """One state from the states that all ranks of a run saved (in any order).

    The result has ``consumed`` as a list, one count per rank, and no ``rank``; load it
    with ``Loader.load_state_dict`` on any number of ranks.

    Raises:
        ValueError: A rank is missing or given twice, or the states disagree (epoch,
            world size, settings, dataset, history: not saved by one run at one point).
    """
    if isinstance(states, dict) or not isinstance(states, (list, tuple)) or not states:
        raise TypeError("merge_states takes a non-empty list of the states of all ranks")
    for state in states:
        _check_shape(state)
        if isinstance(state["consumed"], (list, tuple)):
            raise ValueError("merge_states takes each rank's own state, not one that is already merged")
    first = states[0]
    world_size = first["world_size"]
    own = ("rank", "consumed", "seed")  # seed: each rank may have drawn its own (see for_rank)
    shared = [k for k in first if k not in own]
    for state in states[1:]:
        differ = [k for k in sorted((set(shared) | set(state)) - set(own)) if state.get(k) != first.get(k)]
        if differ:
            raise ValueError(
                f"loader states disagree on {differ}: not saved by one run at one point "
                f"(e.g. {differ[0]}: {first.get(differ[0])!r} vs {state.get(differ[0])!r})"
            )
    by_rank: dict[int, int] = {}
    seeds: dict[int, Any] = {}
    for state in states:
        rank = _int(state.get("rank"), "rank")
        if rank in by_rank or rank >= world_size:
            raise ValueError(
                f"loader states: rank {rank} is {'given twice' if rank in by_rank else 'out of range'}"
                f" (world_size {world_size})"
            )
        by_rank[rank] = _int(state["consumed"], "consumed")
        seeds[rank] = state["seed"]
    if len(by_rank) != world_size:
        missing = sorted(set(range(world_size)) - set(by_rank))
        raise ValueError(f"loader states: the run had {world_size} ranks; the states of ranks {missing} are missing")
    merged = {k: first[k] for k in shared}
    merged["consumed"] = [by_rank[r] for r in range(world_size)]
    merged["seed"] = seeds[0] if len(set(seeds.values())) == 1 else [seeds[r] for r in range(world_size)]
    return merged


def as_merged(state: dict | Sequence[dict]) -> dict:
    """A merged state from what ``load_state_dict`` was given: all ranks' states, a merged
    state, or the one state of a single-rank run."""
    if isinstance(state, (list, tuple)):
        return with_defaults(merge_states(state))
    _check_shape(state)
    if isinstance(state["consumed"], (list, tuple)):
        _ints(state["consumed"], state["world_size"], "consumed")
        return with_defaults(state)
    if state["world_size"] != 1:
        raise ValueError(
            f"this is the state of rank {state.get('rank')} of {state['world_size']}: pass the "
            "states of all ranks (a list), or fastload.merge_states(states)"
        )
    return with_defaults(merge_states([state]))


def with_defaults(state: dict) -> dict:
    """``state`` with the settings that older states lack (ADDED) as they then were."""
    state = {"drop_uneven": False, **state}
    if isinstance(state["seed"], list):
        _ints(state["seed"], state["world_size"], "seed")
    else:
        _int(state["seed"], "seed")
        state.setdefault("shuffle_seed", state["seed"])
    _int(state.get("shuffle_seed"), "shuffle_seed")
    return state


def for_rank(state: dict, rank: int) -> dict:
    """A merged state with one ``seed``: rank ``rank``'s where the ranks drew their own (the
    augmentation of this rank's samples of the interrupted epoch, on an unchanged world size)."""
    seed = state["seed"]
    return {**state, "seed": seed[rank % len(seed)]} if isinstance(seed, list) else state


def seeds(state: dict, keep_order_seed: int | None) -> tuple[int, int]:
    """(seed, shuffle_seed) of a Loader whose seed was drawn, after loading ``state`` (of one
    seed, see for_rank): the state's; the order's stays the Loader's own if it has one."""
    return state["seed"], state["shuffle_seed"] if keep_order_seed is None else keep_order_seed


def check_matches(state: dict, expected: dict) -> None:
    """Raises ValueError naming the first setting or dataset property that differs."""
    for key in SETTINGS:
        if state[key] != expected[key]:
            hint = " (leave seed= out to take the state's)" if key == "seed" else ""
            raise ValueError(
                f"loader state has {key}={state[key]!r} but this loader has {key}={expected[key]!r}" + hint
            )
    have, want = state["dataset"], expected["dataset"]
    if not isinstance(have, dict) or have.get("len") != want["len"]:
        got = have.get("len") if isinstance(have, dict) else have
        raise ValueError(f"loader state is for a dataset of {got} samples; this one has {want['len']}")
    if have.get("fingerprint") != want["fingerprint"]:
        raise ValueError(
            f"loader state is for another dataset of {want['len']} samples (fingerprint "
            f"{have.get('fingerprint')!r}, this one {want['fingerprint']!r}): other files or keys"
        )


def stages(state: dict) -> tuple[Stage, ...]:
    """The merged state's history and its own stage, compacted."""
    history = state["history"]
    if not isinstance(history, (list, tuple)):
        raise ValueError(f"loader state: history must be a list, got {history!r}")
    out = []
    for entry in (*history, state):
        if not isinstance(entry, dict):
            raise ValueError(f"loader state: a history entry must be a dict, got {entry!r}")
        world_size = _int(entry.get("world_size"), "world_size", 1)
        workers = entry.get("num_workers")
        out.append(
            Stage(
                world_size,
                _ints(entry.get("consumed"), world_size, "consumed"),
                None if workers is None else _int(workers, "num_workers"),
            )
        )
    return compact(out)


def indexed_resume(state: dict, num_samples: int, rank: int, world_size: int) -> IndexedResume | None:
    """The pass a map-style loader (rank ``rank`` of ``world_size``) runs after loading ``state``
    (merged and checked): the rest of the interrupted epoch (possibly no batch at all), or
    None when nothing of it was consumed (a normal pass of ``state["epoch"]``)."""
    epoch, batch_size, drop_last, drop_uneven = (
        state["epoch"],
        state["batch_size"],
        state["drop_last"],
        state["drop_uneven"],
    )
    done = stages(state)
    if not done:
        return None
    order = epoch_order(num_samples, state["shuffle_seed"], epoch, state["shuffle"])
    mine = resumed_indices(order, done, rank, world_size, batch_size, drop_last, drop_uneven)
    return IndexedResume(epoch, done, mine, batch_size)


def stream_resume(
    state: dict, rank: int, world_size: int, num_workers: int, num_batches: int, elastic: bool = False
) -> StreamResume:
    """The pass a stream loader (``num_batches`` per epoch) runs after loading ``state``.

    On the ranks and workers of the run that saved it, where every rank stopped at the same
    batch, each reading slot goes on from its record position (``start``). Otherwise the
    saved stages become the pass's ``history``, which only an ``elastic`` stream (one that
    re-deals what they left, e.g. WebDataset) can resume.
    """
    done = stages(state)
    history, start = done, 0
    if done and done[-1].continued_by(world_size, num_workers):
        history, start = done[:-1], done[-1].consumed[0]
    if history and not elastic:
        raise ValueError(
            f"this stream resumes only on the same ranks and workers, where every rank stopped at "
            f"the same batch: the state is of world_size={state['world_size']}, num_workers="
            f"{state.get('num_workers')}, consumed={state['consumed']}; this loader has "
            f"{world_size} and {num_workers}"
        )
    if start > num_batches:
        raise ValueError(f"loader state: {start} batches consumed, but the stream's epoch has {num_batches}")
    return StreamResume(state["epoch"], history=history, start=start)


def dataset_size(dataset: Any) -> int:
    """Samples of a dataset, or records of a stream (one slot holds them all)."""
    return int(dataset.slot_length(1)) if is_stream(dataset) else len(dataset)


def fingerprint(dataset: Any) -> str:
    """A short hash that tells datasets apart without reading a sample.

    The dataset's own ``fingerprint()`` if it has one; otherwise its length and the names
    (``describe``: paths, keys, record offsets) of up to 16 samples spread over it, relative
    to their common folder, so moving the data elsewhere keeps the fingerprint.
    """
    if isinstance(dataset, Fingerprinted):
        return str(dataset.fingerprint())
    n = dataset_size(dataset)
    names: list[str] = []
    if isinstance(dataset, Describes):
        picks = sorted({int(i) for i in np.linspace(0, n - 1, min(n, FINGERPRINT_SAMPLES)).round()})
        names = [name_of(dataset, i) for i in picks]
        if names == [f"sample {i}" for i in picks]:  # a dataset that cannot name its samples: its type
            inner = type(dataset.dataset if isinstance(dataset, (WrappedDataset, SubsetDataset)) else dataset)
            names = [f"{inner.__module__}.{inner.__qualname__}"]
        cut = os.path.commonprefix(names).rfind("/") + 1
        names = [name[cut:] for name in names]
    digest = hashlib.sha256(str(n).encode())
    for name in names:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()[:16]
