"""What the Loader asks of a dataset, declared: the seams between datasets and batch sources.

A batch source never probes a dataset for attributes: it reads one of these Protocols,
once, when it is built (:mod:`fastload.sources.samples`).

- :class:`Loadable`: an indexed dataset (``__len__`` and ``load``); fastload's own datasets,
  :class:`~fastload.WrappedDataset` around a user's, or a user's own with ``load``.
- :class:`Plans`: one whose ``load`` is ``finish(plan(...))`` (see
  :mod:`fastload.datasets.sampleplan`), so a batch can be planned first and its regions decoded
  in one call, or its bytes sent to the GPU. Declared, by its :class:`LoadTraits`
  (:class:`DeclaresLoad`), never inferred from its class or its ``load``'s signature: read
  through :func:`load_traits_of` and :func:`planner_of`.
- :class:`Describes`: names its samples in messages (a path or key).
- :class:`Fingerprinted`: tells itself apart from other datasets for loader states.
- :class:`RecordStream`: read in order by reading slots (``TFRecordStream``, ``WebDataset``);
  its :class:`StreamTraits` say whether it shuffles, resumes elastically and splits whole batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from .sampleplan import SamplePlan


@runtime_checkable
class Loadable(Protocol):
    """An indexed dataset: sample ``index`` decoded and transformed with the draws of (seed, epoch, index).

    ``load`` may also take ``out=`` (a batch row to write the image into, returned as the image),
    where the dataset declares so (:class:`LoadTraits`).
    """

    def __len__(self) -> int: ...

    def load(self, index: int, epoch: int = 0, seed: int = 0) -> tuple[Any, Any]: ...


@runtime_checkable
class Plans(Protocol):
    """A dataset whose ``load`` is ``finish(plan(index, epoch, seed))``, pixel for pixel
    (declared by ``LoadTraits(planned=True)``: having these methods says nothing by itself)."""

    def plan(self, index: int, epoch: int = 0, seed: int = 0) -> SamplePlan: ...

    def finish(
        self, plan: SamplePlan, pixels: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class LoadTraits:
    """What an indexed dataset's ``load`` is, beyond :class:`Loadable`: declared by the dataset's
    class (:class:`DeclaresLoad`), never detected. A dataset that declares nothing is loaded whole,
    without ``out=``: a user's own dataset works as it is.

    Attributes:
        planned: ``load`` is ``finish(plan(index, epoch, seed))`` pixel for pixel, and the dataset
            is :class:`Plans`: a batch may be planned first, its regions decoded in one call or its
            bytes sent to the GPU. A dataset whose ``load`` does anything else must not say so:
            its ``load`` would not run.
        takes_out: ``load`` takes ``out=`` (the batch row to write the image into where it can,
            returned as the image then).
    """

    planned: bool = False
    takes_out: bool = False


@runtime_checkable
class DeclaresLoad(Protocol):
    """A dataset whose class declares what its ``load`` is (see :class:`LoadTraits`)."""

    load_traits: ClassVar[LoadTraits]


@runtime_checkable
class Describes(Protocol):
    """Names sample ``index`` in messages: its path, key or record."""

    def describe(self, index: int) -> str: ...


@runtime_checkable
class Fingerprinted(Protocol):
    """Tells this dataset apart from others without reading a sample (for loader states)."""

    def fingerprint(self) -> str: ...


@runtime_checkable
class Summarized(Protocol):
    """Describes itself for the CLI, the tuner and saved profiles."""

    def summary(self) -> dict: ...


@dataclass(frozen=True)
class StreamTraits:
    """What a record stream can do beyond reading its slots in file order.

    Attributes:
        shuffles: ``records_for(..., order=StreamOrder)`` orders a pass itself (the Loader's ``shuffle=True``).
        elastic: Resumes on other ranks and workers: ``records_for(..., order=)`` with the earlier
            stages of the epoch, and ``resumed_sizes`` for the length of such a pass.
        whole_batches: On one rank, ``records_for(..., batch_size=)`` splits whole batches, unpadded.
    """

    shuffles: bool = False
    elastic: bool = False
    whole_batches: bool = False


@runtime_checkable
class StreamRecordLike(Protocol):
    """One record of a stream: its number (a stable sample id that seeds its draws), its name,
    its target, and why it could not be read (or None)."""

    number: int
    where: str
    error: Exception | None

    @property
    def label(self) -> Any: ...


@runtime_checkable
class RecordStream(Protocol):
    """Records read in order by reading slots (``rank * num_workers + worker`` of all)."""

    def slot_length(self, num_slots: int, *, drop_last: bool = False) -> int: ...

    def records_for(self, slot: int, num_slots: int, *, drop_last: bool = False) -> Iterator[Any]: ...

    def decode(self, record: Any, epoch: int, seed: int) -> np.ndarray: ...


@runtime_checkable
class PlansRecords(Protocol):
    """A stream whose ``decode(record, ...)`` is ``finish(plan_record(record, ...))``, pixel for
    pixel: its batches are planned first (regions decoded in one call) like an indexed dataset's."""

    def plan_record(self, record: Any, epoch: int, seed: int) -> SamplePlan: ...

    def finish(
        self, plan: SamplePlan, pixels: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray: ...


@runtime_checkable
class DeclaresTraits(Protocol):
    """A stream that can do more than read its slots (see :class:`StreamTraits`)."""

    traits: StreamTraits


@runtime_checkable
class ResumedSizes(Protocol):
    """An elastic stream that says how long each slot of a resumed pass is."""

    def resumed_sizes(
        self, num_slots: int, *, drop_last: bool, order: Any, batch_size: int | None = None
    ) -> list[int]: ...


def load_traits_of(dataset: Any) -> LoadTraits:
    """The dataset's declared :class:`LoadTraits` (none declared: loaded whole, without ``out=``).

    Raises:
        TypeError: It declares ``load_traits`` that are not a :class:`LoadTraits`, or declares
            ``planned`` but is not :class:`Plans` (no ``plan`` and ``finish``).
    """
    if not isinstance(dataset, DeclaresLoad):
        return LoadTraits()
    traits = dataset.load_traits
    if not isinstance(traits, LoadTraits):
        raise TypeError(f"{type(dataset).__name__}.load_traits must be a LoadTraits, got {traits!r}")
    if traits.planned and not isinstance(dataset, Plans):
        raise TypeError(f"{type(dataset).__name__} declares LoadTraits(planned=True) but has no plan and finish")
    return traits


def planner_of(dataset: Any) -> Plans | None:
    """The dataset as :class:`Plans` where it declares that its ``load`` is ``finish(plan(...))``, else None."""
    return dataset if load_traits_of(dataset).planned else None


def traits_of(stream: Any) -> StreamTraits:
    """The stream's declared traits (none declared: it reads its slots in file order, no more)."""
    return stream.traits if isinstance(stream, DeclaresTraits) else StreamTraits()


def is_stream(dataset: Any) -> bool:
    """A record stream (read in order by slots), not an indexed dataset."""
    return isinstance(dataset, RecordStream)


def name_of(dataset: Any, index: int) -> str:
    """The dataset's name for sample ``index`` (its path, key or record), else "sample N"."""
    if isinstance(dataset, Describes):
        try:
            return str(dataset.describe(index))
        except Exception:  # naming must never hide the real error
            pass
    return f"sample {index}"
