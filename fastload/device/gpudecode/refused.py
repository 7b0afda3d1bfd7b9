"""The rows of a GPU batch the device's decoder refuses, built by the CPU path; a stream's holes.

A refused row is built by the CPU path's batch builder in this process
(:class:`~fastload.sources.maker.BatchMaker`), as ``decode="cpu"`` builds it, under the
loader's error policy. How it gets there depends on the source (:func:`refused_rows` chooses):

- :class:`ByIndex`: an indexed dataset's row is loaded again by its index (read, planned and
  decoded: the draws of (seed, epoch, index), its errors named by the sample's file).
- :class:`FromBytes`: a stream cannot read a record twice, so its row is planned again from
  the bytes the batch carries (:class:`~fastload.sources.samples.PackedSamples`: the same
  header, the same draws of (seed, epoch, record number), the same verified flag), its errors
  named by the record as the worker would name them. Under ``on_error="skip"`` a record that
  fails is a hole, like a record that failed in the worker (:attr:`EncodedBatch.holes`):
  :func:`neighbour_rows` says which good row of the batch fills each, as a stream's slot
  would (:mod:`fastload.sources.neighbours`): the last good row before it, else the first
  after (a hole the worker left has a good row before it, or the slot had none; one made
  here with none before it takes the first after, not the slot's last good record).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ...batch import SkippedSample
from ...encoded import EncodedBatch
from ...sources.batchplan import BatchPlan, Row, cpu_executor
from ...sources.fetch import SampleLoader
from ...sources.maker import BatchMaker
from ...sources.neighbours import Holes, Owed
from ...sources.pools import PlainPool
from ...sources.request import BatchRequest
from ...sources.samples import PackedRecord
from ...views import Images


@dataclass
class Rebuilt:
    """The refused rows as the CPU path built them, in the order asked.

    Attributes:
        images: uint8 M×H×W×3 (a tuple, one per view).
        labels, indices: M each (after replacements).
        skipped: The samples replaced, or the records that failed (``on_error="skip"``).
        holes: Which of the M rows are holes (a stream's failed records) to fill.
    """

    images: Images
    labels: torch.Tensor
    indices: torch.Tensor
    skipped: tuple[SkippedSample, ...]
    holes: list[int]


class RefusedRows(Protocol):
    def load(self, batch: EncodedBatch, refused: list[int], worker: int) -> Rebuilt:
        """The encoded rows ``refused`` of ``batch`` built by the CPU path, as in-flight row ``worker``."""


class ByIndex:
    """An indexed dataset's refused rows, loaded again by index."""

    def __init__(self, builder: BatchMaker) -> None:
        self.builder = builder

    def load(self, batch: EncodedBatch, refused: list[int], worker: int) -> Rebuilt:
        where = [int(batch.rows[r]) for r in refused]
        request = BatchRequest(batch.epoch, np.asarray([int(batch.indices[j]) for j in where], np.int64), batch.seed)
        host = self.builder.make(request, worker, PlainPool(pin=False))
        return Rebuilt(host.images, host.labels, host.indices, host.skipped, [])


class FromBytes:
    """A stream's refused rows, planned again from the bytes their batch carries."""

    def __init__(self, builder: BatchMaker) -> None:
        self.builder = builder

    def load(self, batch: EncodedBatch, refused: list[int], worker: int) -> Rebuilt:
        where = [int(batch.rows[r]) for r in refused]
        numbers = [int(batch.indices[j]) for j in where]
        records = [
            PackedRecord(number, batch.names[r], bytes(batch.encoded(r)), bool(batch.verified[r]), int(batch.labels[j]))
            for r, j, number in zip(refused, where, numbers)
        ]
        request = BatchRequest(batch.epoch, np.asarray(numbers, np.int64), batch.seed)
        plan = BatchPlan(request, [Row(record, record.number) for record in records])
        holes = Holes()
        made = self.builder.build(plan, worker, PlainPool(pin=False), neighbours=holes)
        if isinstance(made, Owed):  # every one failed (before one fixed the shape): all holes
            zeros = tuple(torch.zeros((len(refused), *t.out_size, 3), dtype=torch.uint8) for t in batch.views())
            images = zeros if batch.multiview else zeros[0]
            labels = batch.labels[torch.as_tensor(where)]
            return Rebuilt(images, labels, torch.as_tensor(numbers), tuple(made.skipped), list(range(len(refused))))
        return Rebuilt(made.images, made.labels, made.indices, made.skipped, holes.rows)


def refused_rows(fallback: SampleLoader) -> RefusedRows:
    """How the refused rows of ``fallback``'s batches are built: by index, or (a stream's) from their bytes."""
    packed = fallback.samples.packed()
    if packed is None:
        return ByIndex(BatchMaker(fallback, cpu_executor(fallback.samples)))
    loader = SampleLoader(packed, fallback.on_error, fallback.inflight)
    return FromBytes(BatchMaker(loader, cpu_executor(packed)))


def neighbour_rows(n: int, holes: list[int]) -> list[int] | None:
    """For each of ``holes`` (sorted rows of a batch of ``n``), the good row it copies: the last
    good row before it, else the first one after it; None when every row is a hole."""
    taken = set(holes)
    good = [j for j in range(n) if j not in taken]
    if not good:
        return None
    return [good[k - 1] if (k := bisect.bisect_left(good, j)) > 0 else good[0] for j in holes]
