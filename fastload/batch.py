"""The typed values that cross the pipeline's seams: a host batch and what was skipped.

A batch source (process workers, threads, a stream) yields :class:`HostBatch` objects
(with ``decode="gpu"``, the EncodedBatches of :mod:`fastload.sources.packed`); the device
driver copies and normalizes them and then calls :meth:`HostBatch.release`, which hands a
reused buffer back to its source only once it is safe to rewrite.
"""

from __future__ import annotations

import copyreg
import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .views import Images, SampleShape, batch_len, map_images, shape_of


class Lease(Protocol):
    """A reused host buffer lent to the consumer; ``release`` gives it back."""

    def release(self, event: Any = None) -> None: ...


class SharedLease(ABC):
    """A lease of a buffer that another process maps: a batch holding one may travel to that
    process, where its images are read from the buffer (:meth:`images`) rather than sent.
    A lease of any other kind keeps its batch in this process."""

    shape: SampleShape  # of the batch the buffer holds

    @abstractmethod
    def images(self) -> Images:
        """The batch's pixels in the buffer, mapped in this process."""

    @abstractmethod
    def release(self, event: Any = None) -> None:
        """Gives the buffer back (once ``event``, if given, has completed)."""


@dataclass(frozen=True)
class SkippedSample:
    """A sample that failed under ``on_error="skip"`` and was replaced by another."""

    epoch: int
    index: int
    where: str  # file, key or record of the sample
    error: str  # "ErrorType: message"

    def __str__(self) -> str:
        return f"epoch {self.epoch}, sample {self.index} ({self.where}): {self.error}"


class SampleError(RuntimeError):
    """A sample failed to load; the message names its index and file or key.

    The original exception is the ``__cause__``.
    """

    def __init__(self, message: str, index: int | None = None, where: str | None = None) -> None:
        # One-argument construction too: DataLoader re-raises worker errors as type(e)(text).
        super().__init__(message)
        self.index, self.where = index, where

    def __reduce__(self):  # crosses process boundaries from DataLoader workers
        return type(self), (self.args[0], self.index, self.where)


class _OfKind(type):
    """The metaclass of a SampleError that is also another error's type (:func:`sample_error`):
    such a class is made at run time, so it is pickled as the type it is made of (a worker's
    error crosses to the main process) and made again where it arrives."""


def _of_kind_init(self: SampleError, message: str, index: int | None = None, where: str | None = None) -> None:
    # The error type's own __init__ with one message, as DataLoader re-raises a worker's error
    # (a TypeError here, e.g. from an __init__ of several arguments: see sample_error).
    type(self).__bases__[0].__init__(self, message)  # type: ignore[misc]
    SampleError.__init__(self, message, index, where)


def _of_kind_str(self: BaseException) -> str:
    # The message as it is (KeyError's own __str__ would quote it).
    return str(self.args[0]) if len(self.args) == 1 else BaseException.__str__(self)


_OF_KIND: dict[type, type] = {}


def of_kind(kind: type[BaseException]) -> type[SampleError] | None:
    """The SampleError subclass that is also a ``kind`` (``kind`` itself when it is a
    SampleError already); None where no such class can be made (a ``kind`` of another
    metaclass, or one whose layout does not combine with RuntimeError's)."""
    if issubclass(kind, SampleError):
        return kind
    made = _OF_KIND.get(kind)
    if made is None:
        body = {
            "__module__": kind.__module__,
            "__qualname__": kind.__qualname__,
            "__doc__": f"A {kind.__name__} that names its sample: a fastload.SampleError too.",
            "__init__": _of_kind_init,
            "__str__": _of_kind_str,
        }
        try:
            made = _OfKind(kind.__name__, (kind, SampleError), body)
        except TypeError:
            return None
        _OF_KIND[kind] = made
    return made


copyreg.pickle(_OfKind, lambda cls: (of_kind, (cls.__bases__[0],)))  # type: ignore[arg-type,return-value]


def sample_error(error: BaseException, message: str, index: int | None, where: str | None) -> SampleError:
    """``error`` of sample ``index`` as the error the loader raises: of ``error``'s own type (so
    ``except KeyError`` still catches a dataset's KeyError) and a :class:`SampleError` (``index``,
    ``where``), with ``message``; a plain SampleError where ``error``'s type cannot be made with
    one message (as DataLoader falls back to RuntimeError). ``error`` is the ``__cause__``."""
    kind = of_kind(type(error))
    named: SampleError | None = None
    if kind is not None:
        try:
            named = kind(message, index, where)
        except Exception:
            named = None
    if named is None:
        named = SampleError(message, index, where)
    else:
        # What code that catches the original reads of it stays: an OSError's errno, strerror
        # and filename, and a dataset's own fields (the sample's index and where stay ours).
        if isinstance(error, OSError) and isinstance(named, OSError):
            named.errno, named.strerror, named.filename = error.errno, error.strerror, error.filename
        for key, value in vars(error).items():
            if key not in ("index", "where"):
                setattr(named, key, value)
    named.__cause__ = error
    return named


def error_kind(error: BaseException) -> str:
    """The name of ``error``'s type as users know it: a dataset's named error by the type it
    names (``DecodeError`` for :class:`fastload.datasets.base.SampleDecodeError`)."""
    if isinstance(error, SampleError):
        named = next((t for t in type(error).__mro__ if not issubclass(t, SampleError)), RuntimeError)
        if named not in (RuntimeError, Exception, BaseException, object):
            return named.__name__
    return type(error).__name__


def names_sample(error: BaseException, index: int) -> bool:
    """Whether ``error`` already names sample ``index`` (a SampleError of it: the loader adds
    no second name). Datasets name theirs with SampleError subclasses of the error's own type
    (e.g. :class:`fastload.datasets.base.SampleDecodeError`)."""
    return isinstance(error, SampleError) and error.index == index


@dataclass
class HostBatch:
    """One uint8 batch in host memory, as a batch source produced it.

    Attributes:
        images: uint8 N×H×W×C, or a tuple of them, one per view, for a multi-view transform
            (:mod:`fastload.views`).
        labels: The targets: int64 N for int labels, else N×... of the targets' dtype
            (see :mod:`fastload.targets`).
        indices: int64 N, the dataset index each row holds (after replacements).
        epoch: The epoch the batch belongs to (its augmentation draws).
        skipped: Samples that failed and were replaced (``on_error="skip"``).
        lease: Set when ``images`` is a reused buffer: see :meth:`release`.
        extras: The samples' further fields (a user's dataset returning ``(image, target,
            path, ...)``), one batched value per field (:func:`fastload.collate.collate_extras`).
    """

    images: Images
    labels: torch.Tensor
    indices: torch.Tensor
    epoch: int
    skipped: tuple[SkippedSample, ...] = ()
    lease: Lease | None = field(default=None, repr=False, compare=False)
    extras: tuple = ()

    def __len__(self) -> int:
        return batch_len(self.images)

    def release(self, event: Any = None) -> None:
        """Gives a reused buffer back: now, or once ``event`` (recorded after its copy) completes.

        Idempotent; a no-op for batches that own their memory.
        """
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release(event)

    def pin_memory(self) -> HostBatch:
        """A copy in pinned memory (torch DataLoader's pin-memory thread calls this); this
        batch's buffer is released, the copy owns its memory."""
        pinned = dataclasses.replace(
            self,
            images=map_images(torch.Tensor.pin_memory, self.images),
            labels=self.labels.pin_memory(),
            indices=self.indices.pin_memory(),
            lease=None,
        )
        self.release()
        return pinned

    def __reduce__(self):
        return _arrived, self._travel()

    def _travel(self) -> tuple:
        return (
            carried(self.images, self.lease),
            travelling(self.labels),
            travelling(self.indices),
            self.epoch,
            self.skipped,
            self.lease,
            _tree(travelling, self.extras),
        )

    def packed(self) -> Packed:
        """This batch made ready to cross to another process now, in the calling thread.

        A worker's batch is pickled by its queue's feeder thread; torch work there (a label
        tensor's ``detach``, which releases the GIL) can meet the worker's interpreter
        finalizing at exit, which ends the thread inside a C++ frame that may not unwind:
        ``terminate called without an active exception`` (issue 40, item 1). Packed in the
        worker's own thread, the feeder only pickles numpy arrays and plain values."""
        return Packed(_arrived, self._travel())


def carried(images: Images, lease: Lease | None) -> Any:
    """How ``images`` cross to another process beside ``lease``: None where they are the
    buffer a shared lease lends (the receiver maps it: :func:`landed`), else each view by value
    (:func:`travelling`). A lease of this process's memory cannot cross.

    Raises:
        TypeError: ``lease`` lends memory of this process only.
    """
    if lease is not None and not isinstance(lease, SharedLease):
        raise TypeError("a batch holding a reused buffer cannot leave its process")
    if isinstance(lease, SharedLease) and shape_of(images) == lease.shape:
        return None
    return map_images(travelling, images)


def landed(images: Any, lease: Any) -> Images:
    """The images that crossed as :func:`carried` sent them: mapped from ``lease``'s buffer, or rebuilt."""
    return lease.images() if images is None else map_images(_rebuilt, images)


def travelling(tensor: torch.Tensor) -> Any:
    """How ``tensor`` crosses to another process: in its shared memory when it has some, else by
    value. (torch would copy it into a new named segment in /dev/shm, one that stays there when
    the message is never received, e.g. from a worker that exits with batches in flight.)"""
    if tensor.is_shared():
        return tensor
    flat = tensor.detach().contiguous().reshape(-1)
    return _ByValue(tensor.dtype, tuple(tensor.shape), flat.view(torch.uint8).numpy().copy() if flat.numel() else None)


@dataclass(frozen=True)
class _ByValue:
    dtype: torch.dtype
    shape: tuple[int, ...]
    data: Any  # uint8 numpy array of the bytes, or None when empty

    def tensor(self) -> torch.Tensor:
        if self.data is None:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.from_numpy(self.data).view(self.dtype).reshape(self.shape)


def is_namedtuple(value: Any) -> bool:
    """Whether ``value`` is a namedtuple (batched and carried field by field, as its type)."""
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _tree(fn: Any, value: Any) -> Any:
    """``value`` (the batched extra fields: tensors in tuples, lists and dicts) with ``fn``
    applied to each tensor (``_ByValue`` to each one travelled so)."""
    if isinstance(value, (torch.Tensor, _ByValue)):
        return fn(value)
    if isinstance(value, dict):
        return {k: _tree(fn, v) for k, v in value.items()}
    if is_namedtuple(value):  # a namedtuple takes its fields one by one
        return type(value)(*(_tree(fn, v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_tree(fn, v) for v in value)
    return value


def _rebuilt(x: Any) -> Any:
    return x.tensor() if isinstance(x, _ByValue) else x


@dataclass(frozen=True)
class Packed:
    """A batch ready to cross to another process (:meth:`HostBatch.packed`): it arrives as
    ``arrive(*travel)``, the batch."""

    arrive: Any
    travel: tuple

    def __reduce__(self):
        return self.arrive, self.travel


def _arrived(
    images: Any, labels: Any, indices: Any, epoch: int, skipped: tuple, lease: Any, extras: tuple = ()
) -> HostBatch:
    """A HostBatch unpickled: its images mapped from the slot its lease names, or rebuilt."""
    return HostBatch(
        landed(images, lease), _rebuilt(labels), _rebuilt(indices), epoch, skipped, lease, _tree(_rebuilt, extras)
    )
