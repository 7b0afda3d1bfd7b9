"""RandomApply: a list of transforms applied together with probability ``p`` (torchvision's)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .compose import Compose
from .settings import Settings, same_items


class RandomApply(Settings):
    """Applies ``transforms`` in order with probability ``p``, else returns the image as is
    (torchvision's ``RandomApply``). One draw from ``rng`` decides; the transforms then draw
    from it too, only when applied.

    Args:
        transforms: Transforms on H×W×C uint8 arrays (``f(img, rng)`` or ``f(img)``).
        p: Probability of applying them.

    Raises:
        TypeError: ``transforms`` is not a list of callables.
        ValueError: ``p`` is not in [0, 1].
    """

    def __init__(self, transforms: Sequence[Any], p: float = 0.5) -> None:
        if not isinstance(transforms, (list, tuple)):
            raise TypeError(f"transforms must be a list of transforms, got {transforms!r}")
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.transforms: list[Any] = list(transforms)  # as torchvision's: the list given
        self.p: float = float(p)
        self._made_of: tuple[tuple, Compose | None] = ((), None)
        self._pipeline()

    def _pipeline(self) -> Compose:
        """The transforms as one pipeline, made again where the list was changed in place (one
        tuple, replaced whole: a thread running it meanwhile sees the old or the new)."""
        seen, pipeline = self._made_of
        if pipeline is None or not same_items(seen, self.transforms):
            pipeline = Compose(self.transforms, reduced_decode=False)
            self._made_of = (tuple(self.transforms), pipeline)
        return pipeline

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if rng.random() >= self.p:
            return img
        return self._pipeline()(img, rng)

    def __repr__(self) -> str:
        return f"RandomApply({self.transforms!r}, p={self.p})"
