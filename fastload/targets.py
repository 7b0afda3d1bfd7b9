"""Per-sample targets → one batch tensor: int labels (the fast path), floats, fixed-shape arrays.

A target is normalized once, where the sample is loaded (:func:`as_target`): a Python
int (int64, the fast path), a Python float (float32, as model outputs are), or a numeric
numpy array of a fixed shape (tensors and lists become arrays; arrays keep their dtype,
lists of ints become int64 and lists with a float float32). The batch's first sample
fixes dtype and shape (:class:`TargetSpec`); every row is then written into one tensor,
so no per-sample Python object outlives the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch

Target = Union[int, float, np.ndarray]
NUMERIC_KINDS = "biuf"  # bool, signed and unsigned int, float
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _bad(value: Any, where: str, why: str) -> TypeError:
    got = (
        f"a dict with keys {sorted(map(str, value))}"
        if isinstance(value, dict)
        else f"{type(value).__name__} {value!r:.60}"
    )
    return TypeError(
        f"{where + ': ' if where else ''}the target {why}, got {got}; targets must be numbers or fixed-shape numeric arrays: pick one with "
        "WrappedDataset(dataset, target_key=...) (a dict key or tuple position of the item, or a "
        "function item -> target), and for paths or other fields use return_index=True and look "
        "them up by index"
    )


def _out_of_range(value: int, where: str) -> ValueError:
    return ValueError(
        f"{where + ': ' if where else ''}the target {value} is outside int64 "
        f"[{INT64_MIN}, {INT64_MAX}], which a batch's int64 labels hold; map such ids to "
        "class indices (or give a float target, or return_index=True and look them up by index)"
    )


def as_target(value: Any, where: str = "") -> Target:
    """``value`` as an int, a float or a numeric array (TypeError naming ``where`` otherwise;
    ValueError for an int outside int64)."""
    if type(value) is int:  # the fast path: fastload's own datasets
        if INT64_MIN <= value <= INT64_MAX:
            return value
        raise _out_of_range(value, where)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = int(value)
        if INT64_MIN <= value <= INT64_MAX:
            return value
        raise _out_of_range(value, where)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    elif isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value)
        except ValueError:
            raise _bad(value, where, "is a ragged sequence") from None
        if value.dtype.kind == "u" and value.size and int(value.max()) > INT64_MAX:
            raise _out_of_range(int(value.max()), where)
        if value.dtype.kind in "iu":
            value = value.astype(np.int64, copy=False)
        elif value.dtype.kind == "f":
            value = value.astype(np.float32, copy=False)
    elif isinstance(value, (bool, np.bool_)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise _bad(value, where, "is not numeric")
    if value.dtype.kind not in NUMERIC_KINDS:
        raise _bad(value, where, f"has dtype {value.dtype}")
    return value


@dataclass(frozen=True)
class TargetSpec:
    """dtype and per-sample shape of a batch's targets."""

    dtype: torch.dtype
    shape: tuple[int, ...] = ()

    @classmethod
    def of(cls, target: Target) -> TargetSpec:
        if type(target) is int:
            return INT_LABELS
        if type(target) is float:
            return cls(torch.float32)
        return cls(torch.from_numpy(np.empty(0, dtype=target.dtype)).dtype, tuple(target.shape))

    def alloc(self, n: int, alloc: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
        """An uninitialised N×shape tensor (``alloc(shape, dtype)`` places it, e.g. pinned)."""
        shape = (n, *self.shape)
        return torch.empty(shape, dtype=self.dtype) if alloc is None else alloc(shape, self.dtype)


INT_LABELS = TargetSpec(torch.int64)


def fill(dst: torch.Tensor, targets: Sequence[Target], name: Callable[[int], str]) -> None:
    """Writes ``targets`` into the rows of ``dst``; ``name(j)`` names row j in errors.

    Raises:
        ValueError: A target's shape differs from the batch's.
        TypeError: A float target in a batch of int targets (it would be truncated).
    """
    rows = dst.numpy()
    if rows.dtype == np.int64 and rows.ndim == 1 and all(type(t) is int for t in targets):
        rows[:] = targets  # int labels: one vectorised write
        return
    integral = rows.dtype.kind in "biu"
    for j, t in enumerate(targets):
        a = np.asarray(t)
        if a.shape != rows.shape[1:]:
            raise ValueError(
                f"{name(j)} has a target of shape {a.shape} but the batch's first sample has "
                f"{rows.shape[1:]}; targets must all have one shape (pad or one-hot them)"
            )
        if integral and a.dtype.kind == "f":
            raise TypeError(
                f"{name(j)} has a float target but the batch's first sample has an integer "
                f"one ({rows.dtype}); give every sample a float target (e.g. float(label))"
            )
        rows[j] = a
