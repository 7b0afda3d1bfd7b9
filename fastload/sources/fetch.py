"""One sample into its batch row under the error policy: the one place samples are loaded and named.

Every batch source, every executor and the device's fall-backs load a row through
:class:`SampleLoader`: a planned sample is finished, any other loaded whole; the image is
checked (uint8 H×W×C of the batch's shape) and the target normalized; an error is named
once (an error of its own type that is a :class:`~fastload.SampleError` too, whose ``index``
says which sample it names) and then
raised (``on_error="raise"``) or the sample replaced by a deterministic random other one
(``"skip"``), reported with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from ..batch import SampleError, SkippedSample, error_kind, names_sample, sample_error
from ..collate import check_image, write_row
from ..datasets.base import sample_rng
from ..datasets.protocols import name_of
from ..datasets.sampleplan import SamplePlan
from ..targets import Target, as_target
from ..views import SampleShape, shape_of
from .inflight import Busy, InFlight
from .samples import RecordSamples, Samples
from .shapes import ShapesDiffer, ShapeTally

MAX_REPLACEMENTS = 10


def describe(dataset: Any, index: int) -> str:
    """The dataset's name for sample ``index`` (path, key or record), else "sample N"."""
    return name_of(dataset, index)


def in_flight(busy: Busy, dataset: Any) -> str:
    """ "sample N (its name)" of a sample in flight; a stream's record as its worker named it,
    "record N (shard, key or byte offset)", as its SampleError would."""
    return busy.name if busy.name is not None else f"sample {busy.index} ({describe(dataset, busy.index)})"


@dataclass
class Loaded:
    """One sample as loaded into (or beside) its batch row."""

    image: np.ndarray | tuple[np.ndarray, ...]  # a tuple: one array per view (a multi-view transform)
    label: Target  # int (the fast path), float or numeric array: see fastload.targets
    index: int  # the sample actually loaded (differs from the request after a replacement)
    skipped: list[SkippedSample]
    extras: tuple = ()  # the sample's further fields (a user's item after image and target)


@dataclass
class Failed:
    """A stream's record that failed under ``on_error="skip"``: its row is its slot's neighbour's.

    Attributes:
        index: The record's number.
        skipped: Its record of the failure, reported with the batch.
    """

    index: int
    skipped: SkippedSample


class PlannedRow(Protocol):
    """How far a sample was prepared before it is loaded: a batch plan's
    :class:`~fastload.sources.batchplan.Row`."""

    plan: SamplePlan | None  # planned: finished from it (None: loaded whole)
    pixels: np.ndarray | None  # its planned region, decoded with the batch's
    error: Exception | None  # what its planning raised: loading it raises this


class SampleLoader:
    """Loads samples into batch rows with the error policy.

    A sample is named by its key: its index, or a stream's record. A stream's failed record
    is not replaced here but by its slot's neighbour: :meth:`row` gives it as :class:`Failed`
    (:mod:`fastload.sources.neighbours`).

    Args:
        samples: The dataset's samples (:class:`~fastload.sources.samples.Samples` or
            :class:`~fastload.sources.samples.RecordSamples`).
        on_error: "raise" (the error names the sample) or "skip" (replace the sample by
            a deterministic random other one, reported with the batch).
        inflight: Table the loading worker marks (for the watchdog and worker deaths).
    """

    def __init__(self, samples: Samples | RecordSamples, on_error: str, inflight: InFlight) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.samples, self.on_error, self.inflight = samples, on_error, inflight
        self.tally = ShapeTally()  # under "skip": images of another shape that dominate raise (see .shapes)

    @property
    def dataset(self) -> Any:
        return self.samples.dataset

    def title(self, key: Any) -> str:
        """ "sample N (its name)" (a stream's: "record N (where)") for messages."""
        return self.samples.title(key)

    def _one(
        self,
        key: Any,
        epoch: int,
        seed: int,
        worker: int,
        out: Any,
        shape: SampleShape | None,
        row: PlannedRow | None = None,
    ) -> tuple[np.ndarray | tuple, Target, tuple]:
        mark = self.inflight.begin(worker, self.samples.number(key), epoch, self.samples.in_flight(key))
        extras: tuple = ()
        try:
            if row is not None and row.error is not None:  # its planning failed: the sample's error, met once
                raise row.error
            if row is not None and row.plan is not None:
                image, target = self.samples.finish(row.plan, row.pixels, out)
            else:
                image, target, *further = self.samples.load(key, epoch, seed, out)
                extras = tuple(further)
        finally:
            self.inflight.end(worker, mark)
        # A bad image is an error of its sample, so the error policy applies to it too.
        check_image(image, "the image")
        expected = shape_of(out) if out is not None else shape
        misfit = shape_error(image, expected)
        if expected is not None and self.on_error == "skip":
            self.tally.count(epoch, expected, shape_of(image), lambda: self.title(key))
        if misfit is not None:
            raise misfit
        return image, as_target(target), extras  # a TypeError here is named as the sample's error

    def load(
        self,
        index: int,
        epoch: int,
        worker: int = 0,
        out: Any = None,
        shape: SampleShape | None = None,
        *,
        seed: int,
        row: PlannedRow | None = None,
    ) -> Loaded:
        """Sample ``index`` (or its replacement) with the draws of (``seed``, ``epoch``), written
        into ``out`` where the transforms allow; finished from its ``row``'s plan (and region's
        pixels) when it was planned, or raising the error its planning met (as the sample's,
        under the policy: read once, so a failure that would not repeat is still its own). An
        image not of ``out``'s shape (or ``shape``) is an error of its sample."""
        got = self._attempt(index, epoch, worker, out, shape, seed, row)
        if isinstance(got, Loaded):
            return got
        error: Exception = got
        skipped = [self.skipped(epoch, index, error)]
        tried = {index}
        rng = sample_rng(seed, epoch, index)
        # Replacements are drawn by index (a stream's are its neighbours, see row()).
        n = len(cast(Samples, self.samples))
        for _ in range(MAX_REPLACEMENTS):
            other = int(rng.integers(n))
            while other in tried and len(tried) < n:
                other = int(rng.integers(n))
            try:
                image, label, extras = self._one(other, epoch, seed, worker, out, shape)
                return Loaded(image, label, other, skipped, extras)
            except ShapesDiffer:
                raise
            except Exception as e:
                skipped.append(self.skipped(epoch, other, e))
                tried.add(other)
                error = e
        raise SampleError(
            f"on_error='skip': sample {index} and {MAX_REPLACEMENTS} replacements failed; last: {skipped[-1]}",
            index,
            skipped[0].where,
        ) from error

    def row(
        self,
        key: Any,
        epoch: int,
        worker: int = 0,
        out: Any = None,
        shape: SampleShape | None = None,
        *,
        seed: int,
        row: PlannedRow | None = None,
    ) -> Loaded | Failed:
        """The sample of ``key`` as :meth:`load` loads it; except that a stream's record, whose
        replacement is its slot's neighbour and not a draw, is :class:`Failed` when it fails under
        ``on_error="skip"`` (its row is then filled by :class:`fastload.sources.neighbours.Neighbours`)."""
        if self.samples.replaces:
            return self.load(key, epoch, worker, out, shape, seed=seed, row=row)
        got = self._attempt(key, epoch, worker, out, shape, seed, row)
        return got if isinstance(got, Loaded) else Failed(self.samples.number(key), self.skipped(epoch, key, got))

    def shapes_beside(self, index: int, epoch: int, worker: int, seed: int, n: int) -> list[SampleShape]:
        """The image shapes of up to ``n`` samples after ``index`` (an indexed dataset's), loaded
        with ``index``'s draws and then dropped; those that fail are passed over, never reported."""
        count, shapes = len(cast(Samples, self.samples)), []
        for k in range(1, min(2 * n, count - 1) + 1):
            try:
                image = self._one((index + k) % count, epoch, seed, worker, None, None)[0]
            except Exception:
                continue
            shapes.append(shape_of(image))
            if len(shapes) == n:
                break
        return shapes

    def _attempt(
        self, key: Any, epoch: int, worker: int, out: Any, shape: SampleShape | None, seed: int, row: PlannedRow | None
    ) -> Loaded | Exception:
        """The sample of ``key`` loaded once, or (under "skip") its error; raised, named, under "raise"."""
        try:
            image, label, extras = self._one(key, epoch, seed, worker, out, shape, row)
            return Loaded(image, label, self.samples.number(key), [], extras)
        except ShapesDiffer:
            raise  # an error of the data, not of the sample: never skipped
        except Exception as e:
            return self._policy(key, e)

    def _policy(self, key: Any, error: Exception) -> Exception:
        """``error``, to be skipped under ``on_error="skip"``; raised, named, under "raise"."""
        if self.on_error == "raise":
            raise self.named(key, error) from error
        return error

    def named(self, key: Any, error: Exception) -> Exception:
        """``error`` if it already names the sample of ``key``, else an error of its type that
        does (and is a SampleError: :func:`~fastload.batch.sample_error`)."""
        number = self.samples.number(key)
        if names_sample(error, number):
            return error
        return sample_error(error, f"{self.title(key)}: {error_kind(error)}: {error}", number, self.samples.name(key))

    def skipped(self, epoch: int, key: Any, error: Exception) -> SkippedSample:
        """The record of a sample that failed under ``on_error="skip"``."""
        # An error that already names its sample (a dataset's DecodeError) is reported by its
        # cause, so the record does not say the name twice.
        number = self.samples.number(key)
        shown = error.__cause__ if names_sample(error, number) and error.__cause__ is not None else error
        return SkippedSample(epoch, number, self.samples.name(key), f"{error_kind(error)}: {shown}")


def shape_error(image: Any, shape: SampleShape | None) -> ValueError | None:
    """The error of an image not of the batch's ``shape`` (None: it fits, or no shape is known)."""
    if shape is None or shape_of(image) == shape:
        return None
    return ValueError(
        f"image has shape {shape_of(image)} but the batch holds {tuple(shape)}; use a transform "
        "with a fixed output size (e.g. RandomResizedCrop or CenterCrop)"
    )


def put(into: Any, item: Loaded, loader: SampleLoader) -> int:
    """Writes ``item`` into its batch row ``into`` (see :func:`fastload.collate.write_row`); the copies made."""
    if item.image is into:
        return 0
    return write_row(into, item.image, loader.samples.title_of(item.index))
