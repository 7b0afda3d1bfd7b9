"""Batch transforms of other libraries (kornia, torchvision) that draw from torch's global generator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class ImagesOnly:
    """Adapts ``fn(images) -> images`` (or, with ``targets=True``, ``fn(images, targets) ->
    (images, targets)``) to the Loader's ``f(images, targets, generator)``.

    Such callables (a kornia ``AugmentationSequential``, torchvision v2 transforms) draw
    from torch's global generators; each call runs inside ``torch.random.fork_rng`` with
    them seeded from ``generator.initial_seed()``, so a Loader's batches stay reproducible
    from (seed, epoch, batch) and the program's own random state is left as it was.

    Args:
        fn: The callable.
        targets: ``fn`` takes and returns (images, targets).

    Raises:
        TypeError: ``fn`` is not callable.
    """

    def __init__(self, fn: Callable[..., Any], targets: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"ImagesOnly takes a callable, got {type(fn).__name__}")
        if not isinstance(targets, bool):
            raise TypeError(f"targets must be True or False, got {targets!r}")
        self.fn, self.targets = fn, targets

    def __call__(self, images: Any, targets: Any, generator: torch.Generator) -> tuple[Any, Any]:
        device = images.device if isinstance(images, torch.Tensor) else torch.device("cpu")
        cuda = (
            [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
        )
        seed = generator.initial_seed()
        with torch.random.fork_rng(devices=cuda):
            torch.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.default_generators[cuda[0]].manual_seed(seed)
            if self.targets:
                out = self.fn(images, targets)
                if not isinstance(out, (tuple, list)) or len(out) != 2:
                    raise TypeError(
                        f"{type(self.fn).__name__} (ImagesOnly(targets=True)) must return "
                        f"(images, targets), got {type(out).__name__}"
                    )
                return out[0], out[1]
            return self.fn(images), targets

    def __repr__(self) -> str:
        return f"ImagesOnly({self.fn!r}{', targets=True' if self.targets else ''})"
