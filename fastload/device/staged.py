"""What crosses between the device driver and its executors.

The driver gives an executor each batch of its source and a :class:`Placement`; the
executor puts the batch's uint8 pixels on the device and gives back a :class:`Staged`
batch, which the driver normalizes and hands over (:mod:`fastload.device.driver`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..views import Images

__all__ = ["Executor", "Placement", "Staged"]


@dataclass(frozen=True)
class Placement:
    """Where an executor puts a batch.

    Attributes:
        device: The driver's device.
        stream: The CUDA side stream the executor queues this batch's work on (the driver's, or
            the stream of the driver thread the batch runs on); None on the CPU.
        indices: Whether the batch's dataset indices are handed out (a host copy, taken
            before any reused buffer goes back).
    """

    device: torch.device
    stream: Any
    indices: bool


@dataclass
class Staged:
    """One batch as an executor left it: uint8 pixels on the device, to be normalized.

    Attributes:
        images: uint8 N×H×W×C on the device (a tuple, one per view); on CUDA queued on the
            batch's stream (:attr:`Placement.stream`: the driver's, or that of the driver
            thread the batch ran on).
        labels: The targets on the device.
        indices: A host copy of the int64 dataset indices, when asked for.
        extras: What a user's batch carried after (images, labels), passed through.
        lease: (CPU) the host batch whose buffer ``images`` still are: released once
            normalization has copied them out.
        keep: What the queued work reads outside torch's allocator: held until the batch's
            ``ready`` event has passed.
        timing: (start, end, bytes) of a host-to-device copy: two timing events around it.
        unpinned: The batch arrived in pageable host memory (its copy could not overlap).
        fallbacks: Rows the executor left to the CPU path.
    """

    images: Images
    labels: torch.Tensor
    indices: torch.Tensor | None = None
    extras: tuple = ()
    lease: Any = None
    keep: list = field(default_factory=list)
    timing: tuple[Any, Any, int] | None = None
    unpinned: bool = False
    fallbacks: int = 0


class Executor(Protocol):
    """Puts one batch of a source on the device (see :class:`Staged`).

    ``threads``: on CUDA, 0 runs :meth:`stage` on the consumer's thread (work queued without
    blocking); n >= 1 runs it on n driver threads, each with its own side stream, a batch on
    each, handed over in order (work that blocks its thread, as a decoder call does).
    :meth:`stage` must then be safe to call from that many threads at once.
    """

    @property
    def threads(self) -> int:
        """Driver threads :meth:`stage` runs on (0: the consumer's thread)."""
        ...

    def stage(self, item: Any, at: Placement) -> Staged:
        """Puts one batch of the source on ``at.device``, its work queued on ``at.stream``."""
        ...
