"""``torch.utils.data.Subset`` of a fastload dataset (``random_split`` parts too), loaded natively."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from .protocols import Loadable, LoadTraits, load_traits_of, name_of
from .storage import SharedArray


class SubsetDataset(torch.utils.data.Dataset):
    """Samples ``indices`` of a fastload dataset, each loaded with the Loader's epoch and seed.

    Through ``Subset.__getitem__`` a fastload dataset would use its own epoch (0) in every
    epoch: the same crops and flips each time. The Loader makes one of these for a Subset
    of a fastload dataset (see :meth:`of`).

    Args:
        dataset: A fastload dataset (``load(index, epoch, seed)`` and ``__len__``).
        indices: Its sample numbers, in the subset's order.

    Raises:
        IndexError: An index is outside ``dataset``.
    """

    #: The dataset as given to the Loader (a torch Subset), set by the Loader: what
    #: ``get_worker_info().dataset`` shows in a worker. None when made otherwise.
    given: Any = None

    #: Its ``load`` is the dataset's (not planned: a subset is loaded sample by sample) and
    #: takes ``out=``, passed on where the dataset declares that its own takes it.
    load_traits: ClassVar[LoadTraits] = LoadTraits(takes_out=True)

    def __init__(self, dataset: Any, indices: Any) -> None:
        self.dataset = dataset
        self.indices = SharedArray(indices, np.int64)
        n = len(dataset)
        bad = self.indices.array[(self.indices.array < 0) | (self.indices.array >= n)]
        if len(bad):
            raise IndexError(f"Subset index {int(bad[0])} is out of range for a dataset of {n} samples")
        self._passes_out = load_traits_of(dataset).takes_out

    @classmethod
    def of(cls, dataset: Any) -> SubsetDataset | None:
        """The native view of ``dataset`` if it is a (nested) Subset of a fastload dataset, else None."""
        if not isinstance(dataset, torch.utils.data.Subset):
            return None
        base = dataset.dataset
        inner = cls.of(base)
        if inner is not None:
            return cls(inner.dataset, inner.indices.array[np.asarray(dataset.indices, dtype=np.int64)])
        return cls(base, dataset.indices) if isinstance(base, Loadable) else None

    def __len__(self) -> int:
        return len(self.indices)

    def load(self, index: int, epoch: int = 0, seed: int = 0, out: np.ndarray | None = None) -> tuple[Any, Any]:
        """Sample ``indices[index]`` of the dataset, with its own augmentation draws."""
        if not 0 <= index < len(self.indices):
            raise IndexError(f"index {index} out of range for a subset of {len(self.indices)} samples")
        original = int(self.indices[index])
        if self._passes_out:
            return self.dataset.load(original, epoch, seed, out=out)
        return self.dataset.load(original, epoch, seed)

    def describe(self, index: int) -> str:
        return name_of(self.dataset, int(self.indices[index]))

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image, target = self.load(int(index))
        return np.ascontiguousarray(image), target
