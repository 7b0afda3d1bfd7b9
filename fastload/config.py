"""One configuration shared by :class:`fastload.Loader` and ``fastload tune``."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BACKENDS = ("process", "thread")
DECODES = ("cpu", "gpu")
START_METHODS = (None, "fork", "spawn", "forkserver")
FLAGS = ("shuffle", "drop_last", "drop_uneven", "persistent_workers", "normalize", "return_index")


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


def resolve_device(device: Any) -> torch.device:
    """``device`` as a torch.device; None means cuda if available, else cpu.

    A CUDA device without an index is this process's GPU (:func:`local_cuda_index`), so
    ``loader.device`` always names the GPU its batches land on.

    Raises:
        ValueError: CUDA was asked for but is not available.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_cuda_index())
    return device


def local_cuda_index() -> int:
    """This process's GPU: the current device once the program chose one (``set_device``),
    else ``LOCAL_RANK``'s under torchrun or Lightning, which start a process per GPU and may
    build the loaders before they call ``set_device`` (as timm and Lightning choose it)."""
    current = torch.cuda.current_device()
    local = os.environ.get("LOCAL_RANK", "").strip()
    if current == 0 and local.isdigit() and int(local) < torch.cuda.device_count():
        return int(local)
    return current


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


@dataclass(frozen=True)
class LoaderConfig:
    """How a Loader batches, parallelises and delivers data.

    Attributes:
        batch_size: Samples per batch (per rank).
        shuffle: Reshuffle every epoch from (seed, epoch).
        drop_last: Drop each rank's last incomplete batch (and the samples that do not
            divide evenly among ranks).
        drop_uneven: Drop the samples that do not divide evenly among ranks instead of
            padding by repeating the first ones (DistributedSampler's ``drop_last``);
            each rank keeps its last incomplete batch unless ``drop_last``.
        num_workers: Worker processes (threads with backend="thread"); "auto" uses the
            tuner's saved profile for this machine and dataset, else the CPUs available.
        prefetch_factor: Batches prepared ahead of the training step per worker (process or
            thread), as in DataLoader: ``prefetch_factor * num_workers`` batches are being
            decoded or wait on the host. The device stage copies a fixed 2 of them ahead.
        persistent_workers: Keep workers alive between epochs.
        pin_memory: Pin host batches; None means "when the device is CUDA".
        backend: "process" (torch DataLoader workers) or "thread".
        start_method: Worker start method (None: ``fork`` on Linux unless this program set its
            own, else the platform default; see :mod:`fastload.sources.start`).
        seed: Base seed; the shuffle order and augmentation depend only on (seed, epoch,
            index). None: the Loader draws one from torch's default generator when it is
            made (as DataLoader does), so ``torch.manual_seed`` sets it and unseeded runs
            differ; ``loader.config.seed`` and ``state_dict()`` then hold what was drawn.
        shuffle_seed: Seed of the shuffle order alone (a DistributedSampler's ``seed``);
            None: ``seed``, or 0 (DistributedSampler's default) where ranks shard the data
            and ``seed`` was drawn: each rank draws its own, but all must deal one order.
        device: Where batches are delivered; None means cuda if available, else cpu.
        normalize: Deliver float (x/255 - mean)/std; False delivers the uint8 batch.
        mean: Per-channel mean, in [0, 1] units.
        std: Per-channel standard deviation, in [0, 1] units.
        dtype: Output dtype when normalizing: "float32", "float16" or "bfloat16" (or
            the torch dtype; stored as its name).
        on_error: "raise" or "skip" (a bad sample is replaced by another and counted).
        timeout: Seconds to wait for a worker's batch (0: forever, as in DataLoader). With
            ``num_workers=0`` (where DataLoader refuses one) it bounds the waits fastload
            makes in the calling thread (the LMDB guard's); a sample's own code there
            cannot be interrupted.
        stall_warning: Seconds without a batch before one warning naming the samples in
            flight and the workers loading them (0: never).
        rank: This process's rank; None reads torch.distributed (else 0).
        world_size: Number of ranks; None reads torch.distributed (else 1).
        return_index: Yield (images, targets, indices): the dataset index of each row,
            an int64 CPU tensor (to look up paths or other per-sample fields).
        decode: "cpu" (workers decode and resize) or "gpu" (workers read bytes and draw
            crops; the batch is decoded, resized, flipped and normalized on the CUDA
            device, see :mod:`fastload.device.gpudecode`; the train/eval presets only).
    """

    batch_size: int = 256
    shuffle: bool = False
    drop_last: bool = False
    drop_uneven: bool = False
    num_workers: Union[int, str] = "auto"
    prefetch_factor: int = 2
    persistent_workers: bool = True
    pin_memory: bool | None = None
    backend: str = "process"
    start_method: str | None = None
    seed: int | None = None
    shuffle_seed: int | None = None
    device: Any = None
    normalize: bool = True
    mean: tuple[float, ...] = field(default=IMAGENET_MEAN)
    std: tuple[float, ...] = field(default=IMAGENET_STD)
    dtype: str = "float32"
    on_error: str = "raise"
    timeout: float = 0.0
    stall_warning: float = 60.0
    rank: int | None = None
    world_size: int | None = None
    return_index: bool = False
    decode: str = "cpu"

    def __post_init__(self) -> None:
        def positive_int(name: str, minimum: int = 1) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")

        for name in FLAGS:
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.pin_memory is not None and not isinstance(self.pin_memory, (bool, np.bool_)):
            raise ValueError(
                f"pin_memory must be True, False or None (when the device is CUDA), got {self.pin_memory!r}"
            )
        positive_int("batch_size")
        positive_int("prefetch_factor")
        for name in ("seed", "shuffle_seed"):
            if getattr(self, name) is not None:
                positive_int(name, 0)
        if self.num_workers != "auto":
            positive_int("num_workers", 0)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.decode not in DECODES:
            raise ValueError(f"decode must be one of {DECODES}, got {self.decode!r}")
        if self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {self.start_method!r}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        mean, std = mean_std(self.mean, self.std)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        for name in ("timeout", "stall_warning"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        if self.world_size is not None:
            positive_int("world_size")
        if self.rank is not None:
            positive_int("rank", 0)
            if self.world_size is not None:
                check_rank(self.rank, self.world_size)

    def replace(self, **changes: Any) -> LoaderConfig:
        """A copy with ``changes`` applied; unknown names raise TypeError listing the valid ones."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            hint = ""
            if set(unknown) & {"transform", "transforms", "target_transform"}:
                # A torchvision habit (Compose in the loader); fastload's transforms run where
                # the image is decoded, so they belong to the dataset.
                hint = (
                    "; transforms belong to the dataset: fl.ImageFolder(root, transform=[...]), or "
                    "fl.WrappedDataset(your_dataset, transform=[...]) for a Dataset of your own"
                )
            raise TypeError(f"unknown Loader option(s) {unknown}; valid: {sorted(names)}{hint}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["device"] = None if self.device is None else str(self.device)
        return d
