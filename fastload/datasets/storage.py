"""Flat, shared per-sample metadata: no per-sample Python objects in a dataset.

A dataset that holds a list of a million ``str`` makes every worker touch a million
refcounts, so fork's copy-on-write copies the pages (pytorch issue 13246). Numpy arrays
avoid that under fork, but under spawn they are pickled by value into every worker.
Here every array lives in a torch shared-memory storage from the start: fork shares
the pages, and torch's multiprocessing pickler sends spawn workers a handle to the
same memory instead of a copy. A plain ``pickle.dumps`` still writes the values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, overload

import numpy as np
import torch


def _shared_tensor(array: np.ndarray) -> torch.Tensor:
    # Allocated in shared memory before any numpy view exists: share_memory_() on an
    # existing tensor swaps its storage, leaving earlier views pointing at freed memory.
    dtype = torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
    tensor = torch.empty(array.shape, dtype=dtype)
    if tensor.numel():
        tensor.share_memory_()
        tensor.numpy()[...] = array
    return tensor


class SharedArray:
    """A read-only 1-D numpy array backed by shared memory.

    Args:
        values: Array-like of numbers, converted to ``dtype``.
        dtype: Numpy dtype torch can hold (int64 by default).
    """

    __slots__ = ("_tensor", "array")

    def __init__(self, values: Any, dtype: Any = np.int64) -> None:
        array = np.asarray(values, dtype=dtype)
        if array.ndim != 1:
            raise ValueError(f"SharedArray needs 1-D values, got shape {array.shape}")
        self._bind(_shared_tensor(array))

    def _bind(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self.array = tensor.numpy()
        self.array.flags.writeable = False

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: Any) -> Any:
        return self.array[index]

    def __getstate__(self) -> torch.Tensor:
        return self._tensor

    def __setstate__(self, tensor: torch.Tensor) -> None:
        self._bind(tensor)

    def __repr__(self) -> str:
        return f"SharedArray(len={len(self)}, dtype={self.array.dtype})"


class StringArray:
    """Immutable sequence of strings packed into one byte buffer plus int64 offsets.

    Args:
        items: Strings (UTF-8 encoded, undecodable path bytes kept via
            surrogateescape) or bytes.
    """

    __slots__ = ("_data", "_offsets")

    def __init__(self, items: Iterable[str | bytes]) -> None:
        encoded = [s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape") for s in items]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self._data = SharedArray(data, np.uint8)
        self._offsets = SharedArray(offsets, np.int64)

    @classmethod
    def from_buffer(cls, data: np.ndarray, offsets: np.ndarray) -> StringArray:
        """Wraps an already packed buffer; ``offsets`` has ``len + 1`` entries."""
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0:
            raise ValueError("offsets must be 1-D and start at 0")
        if np.any(np.diff(offsets) < 0) or offsets[-1] != len(data):
            raise ValueError(f"offsets must be non-decreasing and end at len(data)={len(data)}")
        self = cls.__new__(cls)
        self._data = SharedArray(data, np.uint8)
        self._offsets = SharedArray(offsets, np.int64)
        return self

    @property
    def data(self) -> np.ndarray:
        return self._data.array

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets.array

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get_bytes(self, index: int) -> bytes:
        """The ``index``-th item as bytes."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} strings")
        if index < 0:
            index += n
        off = self._offsets.array
        return self._data.array[off[index] : off[index + 1]].tobytes()

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        """The ``index``-th string; a slice gives a list of them (``dataset.paths[:2]``), as a list would."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.get_bytes(index).decode("utf-8", "surrogateescape")

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self) -> tuple[SharedArray, SharedArray]:
        return self._data, self._offsets

    def __setstate__(self, state: tuple[SharedArray, SharedArray]) -> None:
        self._data, self._offsets = state

    def __repr__(self) -> str:
        return f"StringArray(len={len(self)}, bytes={len(self._data)})"


def as_string_array(items: StringArray | Sequence[str | bytes] | Iterable[str | bytes]) -> StringArray:
    """Returns ``items`` as a StringArray, converting when needed."""
    return items if isinstance(items, StringArray) else StringArray(items)
