"""Which records each reading slot (rank × worker) reads, so every record is read once per epoch."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..stream_slots import batch_ranges


@dataclass(frozen=True)
class Segment:
    """Records ``start`` to ``stop - 1`` (numbered within the file) of file ``file_id``."""

    file_id: int
    start: int
    stop: int


def check_slot(slot: int, num_slots: int) -> None:
    for name, value in (("slot", slot), ("num_slots", num_slots)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if num_slots < 1:
        raise ValueError(f"num_slots must be at least 1, got {num_slots}")
    if not 0 <= slot < num_slots:
        raise ValueError(f"slot {slot} must be in [0, {num_slots})")


def plan_slots(counts: Sequence[int], seekable: Sequence[bool], num_slots: int) -> list[list[Segment]]:
    """Each slot's segments, in file order; together they cover every record once.

    Whole files go to slots (balanced by record count) when some files can only be read
    from their start (GZIP) and there are at least as many non-empty files as slots;
    otherwise the records, in file order, are cut into ``num_slots`` contiguous ranges
    whose sizes differ by at most one.
    """
    nonempty = [i for i, n in enumerate(counts) if n > 0]
    if len(nonempty) >= num_slots and not all(seekable[i] for i in nonempty):
        return _whole_files(counts, nonempty, num_slots)
    return _ranges(counts, num_slots)


def plan_batches(counts: Sequence[int], num_slots: int, batch_size: int, drop_last: bool) -> list[list[Segment]]:
    """One rank's slots: the records, in file order, cut into contiguous runs of whole batches
    (see :func:`fastload.datasets.stream_slots.batch_ranges`), unpadded; GZIP files too, so a
    slot may decompress the part of a file before its run."""
    return _cut(counts, batch_ranges(sum(counts), num_slots, batch_size, drop_last))


def _whole_files(counts: Sequence[int], nonempty: list[int], num_slots: int) -> list[list[Segment]]:
    # Largest first onto the least loaded slot (ties: lowest slot), so loads stay close.
    loads = [(0, slot) for slot in range(num_slots)]
    mine: list[list[int]] = [[] for _ in range(num_slots)]
    for file_id in sorted(nonempty, key=lambda i: (-counts[i], i)):
        load, slot = heapq.heappop(loads)
        mine[slot].append(file_id)
        heapq.heappush(loads, (load + counts[file_id], slot))
    return [[Segment(i, 0, counts[i]) for i in sorted(ids)] for ids in mine]


def _ranges(counts: Sequence[int], num_slots: int) -> list[list[Segment]]:
    total = sum(counts)
    return _cut(counts, [(s * total // num_slots, (s + 1) * total // num_slots) for s in range(num_slots)])


def _cut(counts: Sequence[int], bounds: list[tuple[int, int]]) -> list[list[Segment]]:
    """The segments of each record range ``[lo, hi)`` (record numbers in file order)."""
    starts = list(itertools.accumulate(counts, initial=0))  # record number of each file's first record
    plan: list[list[Segment]] = []
    for lo, hi in bounds:
        segments = []
        file_id = bisect.bisect_right(starts, lo) - 1
        while lo < hi:
            stop = min(hi, starts[file_id + 1])
            if lo < stop:
                segments.append(Segment(file_id, lo - starts[file_id], stop - starts[file_id]))
            lo = stop
            file_id += 1
        plan.append(segments)
    return plan


def shared_prefixes(plan: list[list[Segment]], seekable: Sequence[bool]) -> int:
    """How many unseekable files some slot reads from a record after their first (decompressing the prefix)."""
    return len({s.file_id for segments in plan for s in segments if s.start > 0 and not seekable[s.file_id]})
