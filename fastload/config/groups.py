"""The Loader's grouped options: ``normalize=fl.Normalize(...)`` and ``shard=fl.Shard(...)``.

Each group is a frozen value checked when it is made, so a bad mean or rank is an error
naming it wherever the group is built (a Loader, a LoaderConfig, a tuner's JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_rank(rank: int, world_size: int) -> None:
    """ValueError unless 0 <= rank < world_size."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} must be in [0, {world_size})")


def dtype_name(dtype: Any) -> str:
    """The name in DTYPES of ``dtype`` (a name or a torch dtype); ValueError otherwise."""
    if isinstance(dtype, torch.dtype):
        for name, value in DTYPES.items():
            if value == dtype:
                return name
    elif dtype in DTYPES:
        return dtype
    raise ValueError(
        f"dtype must be one of {tuple(DTYPES)} or the torch dtypes torch.float32, "
        f"torch.float16, torch.bfloat16; got {dtype!r}"
    )


def _unit_values(name: str, values: Any) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, one per channel, got {values!r}") from None
    if any(not 0 <= v <= 1 for v in out):
        hint = (
            f"; divide by 255: {tuple(round(v / 255, 4) for v in out)}"
            if any(v > 1 for v in out) and all(0 <= v <= 255 for v in out)
            else ""
        )
        raise ValueError(
            f"{name} {values!r} is outside [0, 1]: fastload scales pixels to [0, 1] before "
            f"normalizing, so mean and std are in [0, 1] units{hint}"
        )
    return out


def mean_std(mean: Any, std: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Checked per-channel mean and std in [0, 1] units (ValueError naming the bad values)."""
    mean, std = _unit_values("mean", mean), _unit_values("std", std)
    if len(mean) != len(std) or not mean:
        raise ValueError(f"mean {mean!r} and std {std!r} must have one value per channel")
    if any(s <= 0 for s in std):
        raise ValueError(f"std values must be positive, got {std!r}")
    return mean, std


def _int_or_none(name: str, value: Any, minimum: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{name} must be None or an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Normalize:
    """How batches are normalized on the device: ``(x / 255 - mean) / std`` per channel.

    ``Loader(normalize=True)`` (the default) is ``Normalize()``: ImageNet's mean and std,
    float32; ``normalize=False`` hands out the uint8 batch in the same N×C×H×W
    channels_last layout (for your own GPU augmentation).

    Attributes:
        mean: Per-channel mean, in [0, 1] units.
        std: Per-channel standard deviation, in [0, 1] units.
        dtype: Output dtype: "float32", "float16" or "bfloat16" (or the torch dtype;
            stored as its name).

    Raises:
        ValueError: Values outside [0, 1] (the message suggests dividing by 255), a
            non-positive std, mean and std of different lengths, another dtype.
    """

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    dtype: str = "float32"

    def __post_init__(self) -> None:
        mean, std = mean_std(self.mean, self.std)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @classmethod
    def of(cls, value: Any) -> Normalize | Literal[False]:
        """What ``normalize=value`` means: a Normalize, or False (uint8 out). True is
        ``Normalize()``; a mapping (a saved config's) is ``Normalize(**value)``."""
        if isinstance(value, Normalize):
            return value
        if isinstance(value, (bool, np.bool_)):
            return cls() if value else False
        if isinstance(value, Mapping):
            return cls(**value)
        if value is cls:
            raise ValueError(
                "normalize=fl.Normalize is the class: call it, fl.Normalize() (ImageNet's) or "
                "fl.Normalize(mean=..., std=..., dtype=...)"
            )
        raise ValueError(f"normalize must be True, False or fl.Normalize(mean=..., std=..., dtype=...), got {value!r}")


@dataclass(frozen=True)
class Shard:
    """This process's share of the samples when several ranks read one dataset (DDP).

    The settings of a ``DistributedSampler``: ``Loader(sampler=DistributedSampler(...))``
    sets them from the sampler. Rank and world size not given are read from
    torch.distributed at each pass (else 0 and 1).

    Attributes:
        rank: This process's rank; None reads torch.distributed (else 0).
        world_size: Number of ranks; None reads torch.distributed (else 1).
        drop_uneven: Drop the samples that do not divide evenly among ranks instead of
            padding by repeating the first ones (DistributedSampler's ``drop_last``);
            each rank keeps its last incomplete batch unless the Loader's ``drop_last``.
        shuffle_seed: Seed of the shuffle order alone (DistributedSampler's ``seed``);
            None: the Loader's ``seed``, or 0 (DistributedSampler's default) where ranks
            shard the data and ``seed`` was drawn: each rank draws its own, but all must
            deal one order.

    Raises:
        ValueError: A negative rank, a world size < 1, a rank not below the world size,
            a ``drop_uneven`` that is not True or False.
    """

    rank: int | None = None
    world_size: int | None = None
    drop_uneven: bool = False
    shuffle_seed: int | None = None

    def __post_init__(self) -> None:
        _int_or_none("rank", self.rank, 0)
        _int_or_none("world_size", self.world_size, 1)
        _int_or_none("shuffle_seed", self.shuffle_seed, 0)
        if not isinstance(self.drop_uneven, (bool, np.bool_)):
            raise ValueError(f"drop_uneven must be True or False, got {self.drop_uneven!r}")
        object.__setattr__(self, "drop_uneven", bool(self.drop_uneven))
        if self.rank is not None and self.world_size is not None:
            check_rank(self.rank, self.world_size)

    @classmethod
    def of(cls, value: Any) -> Shard:
        """What ``shard=value`` means: None is ``Shard()``; a mapping (a saved config's) is
        ``Shard(**value)``."""
        if isinstance(value, Shard):
            return value
        if value is None:
            return cls()
        if isinstance(value, Mapping):
            return cls(**value)
        if value is cls:
            raise ValueError("shard=fl.Shard is the class: call it, fl.Shard(rank=..., world_size=...)")
        raise ValueError(
            f"shard must be fl.Shard(rank=..., world_size=..., drop_uneven=..., shuffle_seed=...), got {value!r}"
        )
