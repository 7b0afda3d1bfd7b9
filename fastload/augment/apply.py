"""``Loader(batch_transform=...)``: per-batch augmentations on the device, each with its own
generator seeded from (seed, epoch, rank, batch, position in the list).

The Loader calls :meth:`BatchTransforms.apply` on each batch as it hands it out, after the
device stage has normalized it. The batch's number counts this rank's batches of the epoch
from 0, resumed epochs included (a resumed pass goes on with the numbers, and so with the
draws, of the run it continues), so the output depends on (seed, epoch, rank, batch)
alone: not on workers, backend, or where a run was interrupted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .sampling import on_device

BatchTransform = Callable[[Any, torch.Tensor, torch.Generator], tuple[Any, torch.Tensor]]
_TAG = 0x62617463  # "batc": keeps these seeds apart from those of samples and orders


def batch_seed(seed: int, epoch: int, batch: int, rank: int = 0, slot: int = 0) -> int:
    """The seed of batch ``batch`` of ``epoch`` on ``rank`` for the ``slot``-th transform: a
    63-bit int (numpy's SeedSequence hash of the five numbers)."""
    state = np.random.SeedSequence((int(seed), int(epoch), int(batch), int(rank), int(slot), _TAG))
    return int(state.generate_state(1, np.uint64)[0] >> np.uint64(1))


def batch_generator(
    seed: int, epoch: int, batch: int, *, rank: int = 0, slot: int = 0, device: Any = "cpu"
) -> torch.Generator:
    """The generator the Loader hands to its ``slot``-th batch transform for that batch: on
    ``device`` where torch has generators there, else on the CPU. To reproduce a batch's
    draws outside the Loader, or to test a transform."""
    return on_device(torch.device(device)).manual_seed(batch_seed(seed, epoch, batch, rank, slot))


# torchvision's and timm's batch augmentations -> their fastload forms (same arguments).
_EQUIVALENTS = {
    ("torchvision", "MixUp"): "fl.augment.MixUp(alpha=..., num_classes=...)",
    ("torchvision", "CutMix"): "fl.augment.CutMix(alpha=..., num_classes=...)",
    ("torchvision", "RandomChoice"): "fl.augment.RandomChoice([...], p=...)",
    ("torchvision", "RandomErasing"): "fl.augment.RandomErasing(probability, mode=...) (timm's arguments)",
    ("timm", "Mixup"): "fl.augment.Mixup(...)",
    ("timm", "FastCollateMixup"): "fl.augment.Mixup(...)",
    ("timm", "RandomErasing"): "fl.augment.RandomErasing(...)",
}


def _foreign_error(fn: Any, where: str) -> str | None:
    """The TypeError message for a torchvision or timm batch augmentation given as a batch
    transform (they neither take the Loader's generator nor return (images, targets))."""
    library = type(fn).__module__.split(".")[0]
    if library not in ("torchvision", "timm"):
        return None
    name = type(fn).__name__
    use = _EQUIVALENTS.get((library, name))
    instead = (
        f"use {use}"
        if use is not None
        else "wrap it as fl.augment.ImagesOnly(f) (images only) or fl.augment.ImagesOnly(f, targets=True)"
    )
    return (
        f"{where} is {library}'s {name}: {instead}, which draws from the Loader's per-batch generator "
        "(reproducible and resumable)"
    )


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _takes_three(fn: Any) -> bool | None:
    """Whether ``fn`` can be called with three positional arguments (None: cannot tell)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # builtins and some extension types have none
        return None
    try:
        signature.bind(None, None, None)
    except TypeError:
        return False
    return True


class BatchTransforms:
    """The checked list of a Loader's batch transforms.

    Each is called as ``f(images, targets, generator) -> (images, targets)``.

    Raises:
        TypeError: Not a callable or a list of them, or one that cannot take three
            arguments (the message says how to adapt it).
    """

    def __init__(self, transforms: BatchTransform | Sequence[BatchTransform]) -> None:
        items: list[Any] = list(transforms) if isinstance(transforms, (list, tuple)) else [transforms]
        for i, fn in enumerate(items):
            where = f"batch_transform[{i}]" if isinstance(transforms, (list, tuple)) else "batch_transform"
            if not callable(fn):
                raise TypeError(
                    f"{where} must be a callable f(images, targets, generator) -> (images, targets), "
                    f"got {type(fn).__name__}"
                )
            foreign = _foreign_error(fn, where)
            if foreign is not None:
                raise TypeError(foreign)
            if _takes_three(fn) is False:
                raise TypeError(
                    f"{where} ({_name(fn)}) cannot be called as f(images, targets, generator): wrap "
                    "an images-only callable (e.g. a kornia pipeline) as fl.augment.ImagesOnly(f), "
                    "one taking (images, targets) as fl.augment.ImagesOnly(f, targets=True)"
                )
        self.transforms = tuple(items)
        self._generators: dict[tuple[torch.device, int], torch.Generator] = {}

    @classmethod
    def of(cls, value: Any) -> BatchTransforms | None:
        """The transforms ``batch_transform=value`` means; None for None or an empty list."""
        if value is None or (isinstance(value, (list, tuple)) and not value):
            return None
        return value if isinstance(value, BatchTransforms) else cls(value)

    def _generator(self, device: torch.device, slot: int, seed: int) -> torch.Generator:
        key = (device, slot)
        if key not in self._generators:
            self._generators[key] = on_device(device)  # made once; re-seeded for every batch
        return self._generators[key].manual_seed(seed)

    def apply(self, out: tuple, *, seed: int, epoch: int, batch: int, rank: int = 0) -> tuple:
        """``out`` (images, targets, ...) with its images and targets transformed; what
        follows them (the indices of ``return_index=True``) is passed through."""
        images, targets = out[0], out[1]
        device = images.device if isinstance(images, torch.Tensor) else torch.device("cpu")
        for slot, fn in enumerate(self.transforms):
            generator = self._generator(device, slot, batch_seed(seed, epoch, batch, rank, slot))
            result = fn(images, targets, generator)
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                got = f"a {len(result)}-tuple" if isinstance(result, (tuple, list)) else type(result).__name__
                raise TypeError(
                    f"batch_transform {_name(fn)} returned {got}; it must return (images, targets) "
                    "(wrap an images-only callable as fl.augment.ImagesOnly(f))"
                )
            images, targets = result
        return (images, targets) + tuple(out[2:])

    def __repr__(self) -> str:
        return f"BatchTransforms({list(self.transforms)!r})"
