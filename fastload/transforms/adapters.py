"""Third-party augmentation libraries as fastload transforms."""

from __future__ import annotations

import copy
import random
import threading
from typing import Any

import numpy as np

from .settings import Settings


class Albumentations(Settings):
    """An albumentations pipeline as an ``f(img, rng)`` transform.

    Each call hands the pipeline generators drawn from ``rng`` (albumentations >= 2's
    ``set_random_state``), so its draws too depend only on (seed, epoch, index). Each
    thread uses its own copy of the pipeline.

    Args:
        aug: e.g. ``A.Compose([...])``, called as ``aug(image=img)[key]``.
        key: The output key of the image.
    """

    def __init__(self, aug: Any, key: str = "image") -> None:
        if not callable(aug):
            raise TypeError(f"{aug!r} is not callable")
        self.aug, self.key = aug, key
        self._local = threading.local()

    def _pipeline(self) -> Any:
        aug = getattr(self._local, "aug", None)
        if aug is None:
            aug = self._local.aug = copy.deepcopy(self.aug)
        return aug

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        aug = self._pipeline()
        seed_with = getattr(aug, "set_random_state", None)
        if seed_with is not None:
            seed_with(np.random.default_rng(rng.integers(2**63)), random.Random(int(rng.integers(2**63))))
        return aug(image=np.ascontiguousarray(img))[self.key]

    def __getstate__(self) -> dict:
        return {"aug": self.aug, "key": self.key}

    def __setstate__(self, state: dict) -> None:
        self.aug, self.key = state["aug"], state["key"]
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"albumentations({self.aug!r})"


def albumentations(aug: Any, key: str = "image") -> Albumentations:
    """``fl.transforms.albumentations(A.Compose([...]))``: an albumentations pipeline as a
    fastload transform, reproducible per (seed, epoch, index) (see :class:`Albumentations`)."""
    return Albumentations(aug, key)
