"""Which samples are known to decode clean: region decode is allowed for those only.

A region decode (:mod:`fastload.decode.roi`) cannot see libjpeg's warnings about corrupt
entropy data, and never reads the data below its crop. So the first decode of every
sample is a strict one (full or DCT-scaled: libjpeg entropy-decodes every byte at any
scale and fails on its warnings), and a sample that passed is marked here; only marked
samples get region decodes later. Where region decode would have served an unmarked
sample, the full decode does, with the same pixels, so marks change speed, never output.

The marks are one byte per sample in shared memory, made with the dataset (before any
worker starts): forked workers share the pages, spawned ones get a handle through
torch's multiprocessing pickler, threads share the object. A mark is only ever set,
so two workers marking the same sample at once both write 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class CleanMarks:
    """One shared byte per sample: 1 once the sample decoded clean under a strict decoder.

    Args:
        size: Number of samples.
    """

    __slots__ = ("_tensor", "_array")

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        tensor = torch.zeros(size, dtype=torch.uint8)
        if size:
            tensor.share_memory_()  # before any numpy view exists (see fastload.datasets.storage)
        self._bind(tensor)

    def _bind(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._array = tensor.numpy()

    def __len__(self) -> int:
        return len(self._array)

    def is_clean(self, index: int) -> bool:
        """Whether sample ``index`` decoded clean before (False when out of range)."""
        return 0 <= index < len(self._array) and bool(self._array[index])

    def mark(self, index: int) -> None:
        """Records that sample ``index`` decoded clean (ignored when out of range)."""
        if 0 <= index < len(self._array):
            self._array[index] = 1

    def decode(
        self,
        index: int,
        transform: Any,
        data: Any,
        decoder: Any,
        rng: np.random.Generator,
        out: np.ndarray | None = None,
        max_pixels: int | None = None,
    ) -> np.ndarray:
        """``transform.decode`` of sample ``index`` (a :class:`fastload.transforms.Compose`),
        region decode allowed only if it is marked; marked after a clean strict decode."""
        known = self.is_clean(index)
        img = transform.decode(data, decoder, rng, out, max_pixels, region_ok=known)
        if not known and getattr(decoder, "strict", False):
            self.mark(index)
        return img

    def count(self) -> int:
        """How many samples are marked."""
        return int(np.count_nonzero(self._array))

    def clear(self) -> None:
        """Forgets every mark (e.g. after the files were rewritten)."""
        self._array[...] = 0

    def __getstate__(self) -> torch.Tensor:
        return self._tensor

    def __setstate__(self, tensor: torch.Tensor) -> None:
        self._bind(tensor)

    def __repr__(self) -> str:
        return f"CleanMarks(len={len(self)}, clean={self.count()})"
