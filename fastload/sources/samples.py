"""How a batch source reaches a dataset's samples: planned where the dataset plans, else loaded whole.

:class:`Samples` (an indexed dataset, samples keyed by index) and :class:`RecordSamples` (a
stream, keyed by the records its slots read) read the dataset's declared protocols once
(:mod:`fastload.datasets.protocols`) and offer a batch source the same few things:
:meth:`~Samples.plan` a sample (bytes read, header checked, crop drawn:
:class:`~fastload.datasets.sampleplan.SamplePlan`), :meth:`~Samples.finish` a planned one
(decode, resize, the later transforms), :meth:`~Samples.load` one whole (a dataset that does
not plan, e.g. a user's own through :class:`~fastload.WrappedDataset`; or a sample whose
planning failed, which then meets its error where the policy applies), and name it.
``finish(plan(k))`` is ``load(k)`` pixel for pixel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..datasets.base import sample_name
from ..datasets.protocols import PlansRecords, StreamRecordLike, load_traits_of, name_of
from ..datasets.sampleplan import SamplePlan


class Samples:
    """A dataset's samples as a batch source loads them.

    Args:
        dataset: A fastload dataset, a wrapped user dataset, or anything with ``__len__`` and
            ``load(index, epoch, seed)`` (:class:`~fastload.datasets.protocols.Loadable`); its
            declared :class:`~fastload.datasets.protocols.LoadTraits` say whether it is planned
            and whether its ``load`` takes ``out=``.
    """

    #: A failed sample is replaced by a draw of another index (under ``on_error="skip"``).
    replaces = True

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        traits = load_traits_of(dataset)
        self.plans = traits.planned  # its load is finish(plan(...)): a batch may be planned first
        self._out = traits.takes_out

    def __len__(self) -> int:
        return len(self.dataset)

    def name(self, index: int) -> str:
        """The dataset's name for sample ``index`` (path, key or record), else "sample N"."""
        return name_of(self.dataset, index)

    def number(self, index: int) -> int:
        """The sample's number: its index (seeds its draws, names it in the in-flight table)."""
        return index

    def title(self, index: int) -> str:
        """ "sample N (its name)", for messages."""
        return sample_name(index, self.name(index))

    title_of = title  # a loaded sample, by its number

    def in_flight(self, index: int) -> str | None:
        """None: the main process names sample ``index`` in flight itself (by :meth:`name`)."""
        return None

    def packed(self) -> None:
        """None: a row the GPU decoder refuses is loaded again by its index (see :meth:`RecordSamples.packed`)."""
        return None

    def plan(self, index: int, epoch: int, seed: int) -> SamplePlan:
        """Sample ``index`` read, its header checked and its crop drawn (only where :attr:`plans`)."""
        return self.dataset.plan(index, epoch, seed)

    def finish(self, plan: SamplePlan, pixels: np.ndarray | None, out: Any) -> tuple[Any, Any]:
        """(image, target) of a planned sample, written into ``out`` where the transforms allow;
        ``pixels``: its planned region, already decoded."""
        return self.dataset.finish(plan, pixels, out), plan.label

    def load(self, index: int, epoch: int, seed: int, out: Any = None) -> tuple:
        """(image, target) of sample ``index``, loaded whole (into ``out`` where it can); then
        its further fields, where the dataset gives some (a wrapped user dataset's items)."""
        if out is None or not self._out:
            return self.dataset.load(index, epoch, seed)
        return self.dataset.load(index, epoch, seed, out=out)


class RecordSamples:
    """A stream's samples, keyed by the records its reading slots yield (each with its number,
    name, target and read error, see :class:`~fastload.datasets.protocols.RecordStream`).

    Args:
        stream: The stream; one that plans its records (:class:`~fastload.datasets.protocols.PlansRecords`)
            has its batches planned first, like an indexed dataset that plans.
    """

    #: A failed record is replaced by its slot's neighbour, not a draw (see :mod:`fastload.sources.neighbours`).
    replaces = False

    def __init__(self, stream: Any) -> None:
        self.dataset = stream
        self.plans = isinstance(stream, PlansRecords)

    def name(self, record: StreamRecordLike) -> str:
        return str(record.where)

    def number(self, record: StreamRecordLike) -> int:
        return int(record.number)

    def title(self, record: StreamRecordLike) -> str:
        """ "record N (where)", for messages."""
        return f"record {record.number} ({record.where})"

    def in_flight(self, record: StreamRecordLike) -> str | None:
        """What the in-flight table calls ``record`` (the main process has only its number)."""
        return self.title(record)

    def title_of(self, number: int) -> str:
        """ "record N": a loaded sample, by its number."""
        return f"record {number}"

    def packed(self) -> PackedSamples:
        """The stream's records as the device plans them again from the bytes a GPU batch
        carries (a row the GPU decoder refused: a stream cannot read a record twice)."""
        return PackedSamples(self.dataset)

    def plan(self, record: StreamRecordLike, epoch: int, seed: int) -> SamplePlan:
        """The record read (its image, then its target), its header checked and its crop drawn
        (raises its read error). Read now, in the slot's order: a reader may let go of a shard's
        bytes once its records are read."""
        plan = self.dataset.plan_record(record, epoch, seed)
        plan.label = int(record.label)
        return plan

    def finish(self, plan: SamplePlan, pixels: np.ndarray | None, out: Any) -> tuple[Any, Any]:
        return self.dataset.finish(plan, pixels, out), plan.label

    def load(self, record: StreamRecordLike, epoch: int, seed: int, out: Any = None) -> tuple[Any, Any]:
        """(image, target) of ``record``, decoded whole (raises its read error)."""
        if record.error is not None:
            raise record.error
        if self.plans:
            return self.dataset.finish(self.dataset.plan_record(record, epoch, seed)), int(record.label)
        return self.dataset.decode(record, epoch, seed), int(record.label)


@dataclass
class PackedRecord:
    """A stream's record as a GPU batch carries it (:class:`~fastload.encoded.EncodedBatch`):
    its number, its name, its encoded image, whether those bytes were verified, its target."""

    number: int
    where: str
    image: Any
    verified: bool
    label: int
    error: Exception | None = None  # it was read: a record that could not be is never packed


class PackedSamples(RecordSamples):
    """A stream's records planned from the bytes packed for the GPU (:class:`PackedRecord`),
    with the draws, plan and names the worker's read record had: for the rows the device's
    decoder refuses."""

    def plan(self, record: StreamRecordLike, epoch: int, seed: int) -> SamplePlan:
        packed = _packed(record)
        plan = self.dataset.plan_bytes(packed.number, packed.image, epoch, seed, packed.verified)
        plan.label = packed.label
        return plan

    def load(self, record: StreamRecordLike, epoch: int, seed: int, out: Any = None) -> tuple[Any, Any]:
        """(image, target) of ``record``, decoded whole from its packed bytes."""
        packed = _packed(record)
        return self.dataset.finish(self.plan(packed, epoch, seed)), packed.label


def _packed(record: StreamRecordLike) -> PackedRecord:
    assert isinstance(record, PackedRecord)  # PackedSamples' rows are made from a packed batch only
    return record
