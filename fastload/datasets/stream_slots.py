"""How one rank's workers split a stream: whole batches, contiguous, unpadded.

Across ranks, every reading slot yields as many records (a short slot pads), since
DDP needs equal batch counts per rank. On one rank nothing needs to match, so the
records are cut into batches as DataLoader would batch them, and each worker reads a
contiguous run of whole batches: every record once, and ``ceil(total / batch_size)``
batches (``total // batch_size`` with ``drop_last``), only the epoch's last one short.

DataLoader takes batches from its workers in turn and passes over a worker that has
ended, so batch ``j`` of the rank is a batch of slot ``j % num_slots`` as long as
lower-numbered slots hold at most one batch more than higher ones. Resuming by batch
count (:func:`slot_batches_done`) relies on that.
"""

from __future__ import annotations


def check_batch_size(batch_size: int) -> None:
    """Raises TypeError/ValueError naming ``batch_size`` unless it is an int of at least 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")


def batch_count(total: int, batch_size: int, drop_last: bool) -> int:
    """Batches of ``total`` records: the last one short, or dropped with ``drop_last``."""
    return total // batch_size if drop_last else -(-total // batch_size)


def batch_ranges(total: int, num_slots: int, batch_size: int, drop_last: bool) -> list[tuple[int, int]]:
    """Record ranges ``[lo, hi)`` of the ``num_slots`` slots of one rank, contiguous, in slot order.

    Slot ``s`` holds the batches ``j`` with ``j % num_slots == s``; the slot holding the
    last batch ends with its short part. With ``drop_last`` the records past the last whole
    batch are in no slot. A slot may be empty (fewer batches than slots).

    Raises:
        ValueError: ``batch_size`` or ``num_slots`` is below 1, or ``total`` is negative.
    """
    if batch_size < 1 or num_slots < 1 or total < 0:
        raise ValueError(
            f"batch_ranges needs batch_size >= 1, num_slots >= 1 and total >= 0, got "
            f"{batch_size}, {num_slots} and {total}"
        )
    batches = batch_count(total, batch_size, drop_last)
    short = batches * batch_size - total if not drop_last else 0  # records the last batch lacks
    ranges, lo = [], 0
    for slot in range(num_slots):
        size = (batches - slot + num_slots - 1) // num_slots * batch_size
        if batches and slot == (batches - 1) % num_slots:
            size -= short
        ranges.append((lo, lo + size))
        lo += size
    return ranges


def slot_batches_done(start: int, local: int, workers: int) -> int:
    """Batches of the rank's slot ``local`` among the first ``start`` batches of the rank.

    DataLoader takes batches from its workers in turn, so batch j of the rank is batch
    j // workers of slot j % workers (every slot has as many batches, or on one rank
    lower-numbered slots at most one more).
    """
    return max(0, (start - local + workers - 1) // workers)
