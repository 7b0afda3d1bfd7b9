"""One configuration shared by :class:`fastload.Loader` and ``fastload tune``."""

from __future__ import annotations

import dataclasses
import functools
import math
import multiprocessing.context
import os
import threading
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch

from .groups import DTYPES, IMAGENET_MEAN, IMAGENET_STD, Normalize, Shard, check_rank, dtype_name, mean_std
from .spellings import OLD, read_old, upgrade

__all__ = [
    "DTYPES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LoaderConfig",
    "Normalize",
    "Shard",
    "check_rank",
    "dtype_name",
    "mean_std",
    "resolve_device",
]

BACKENDS = ("process", "thread")
DECODES = ("cpu", "gpu")
#: Batches the device stage copies ahead of the consumer (a fixed part of the pipeline; the
#: thread backend's ring and the tuner's memory model count them).
DEVICE_AHEAD = 2
START_METHODS = (None, "fork", "spawn", "forkserver")
FLAGS = ("shuffle", "drop_last", "persistent_workers", "return_index")


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


SEED_LIMIT = 2**64  # torch's generators take seeds in [0, 2**64)


def check_device(device: Any) -> None:
    """Refuses a ``device=`` that names no device (ValueError) or is not a device's name, index
    or torch.device (TypeError), naming it, when the Loader is made (not torch's error later)."""
    if device is None or isinstance(device, torch.device):
        return
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(
            f"device must be a device name ('cpu', 'cuda', 'cuda:1'), a CUDA index, a torch.device "
            f"or None, got {type(device).__name__} {device!r}"
        )
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device={device}: a CUDA index must be >= 0")
        if not torch.cuda.is_available():
            raise ValueError(f"device={device} (cuda:{device}) requested but CUDA is not available")
        return
    try:
        torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"device={device!r} names no device torch knows; give 'cpu', 'cuda', 'cuda:N' or None"
        ) from None


def local_cuda_index() -> int:
    """This process's GPU: the current device once the program chose one (``set_device``),
    else ``LOCAL_RANK``'s under torchrun or Lightning, which start a process per GPU and may
    build the loaders before they call ``set_device`` (as timm and Lightning choose it)."""
    current = torch.cuda.current_device()
    local = os.environ.get("LOCAL_RANK", "").strip()
    if current == 0 and local.isdigit() and int(local) < torch.cuda.device_count():
        return int(local)
    return current


def start_method_of(context: Any) -> str | None:
    """The start method ``multiprocessing_context=context`` names: None, a method's name, or a
    multiprocessing context's (``multiprocessing.get_context("spawn")``, torch's too)."""
    if isinstance(context, multiprocessing.context.BaseContext):
        return context.get_start_method()
    if context is None or context in START_METHODS:
        return context
    # DataLoader's own words first (searched for, they still lead here), then what to give.
    said = (
        f"should specify a valid start method in {[m for m in START_METHODS if m]!r}"
        if isinstance(context, str)
        else "should be a valid context object or a string specifying the start method"
    )
    raise (ValueError if isinstance(context, str) else TypeError)(
        f"multiprocessing_context option {said} (as in DataLoader), but got multiprocessing_context={context!r}: "
        "give a start method name ('fork', 'spawn', 'forkserver'), a multiprocessing context, or None"
    )


def gpu_cpu_share(value: Any) -> float | str | None:
    """``gpu_cpu_share`` checked: "auto", None, or a number in [0, 1] (as a float).

    Raises:
        ValueError: Anything else, naming it.
    """
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"gpu_cpu_share must be a number in [0, 1], 'auto' or None, got {value!r}")
    if not 0.0 <= float(value) <= 1.0:  # also NaN
        raise ValueError(f"gpu_cpu_share must be a number in [0, 1], 'auto' or None, got {value!r}")
    return float(value)


def _old_spellings(cls: type) -> type:
    """Lets the generated ``__init__`` of ``cls`` take the options' old spellings too, each
    with a DeprecationWarning naming its new form (:mod:`.spellings`)."""
    init = vars(cls)["__init__"]  # the one @dataclass generated

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **options: Any) -> None:
        init(self, *args, **upgrade(options, DEFAULT_GROUPS, "fl.LoaderConfig", stacklevel=3))

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


DEFAULT_GROUPS = {"normalize": Normalize(), "shard": Shard()}


@_old_spellings
@dataclass(frozen=True)
class LoaderConfig:
    """How a Loader batches, parallelises and delivers data.

    Attributes:
        batch_size: Samples per batch (per rank).
        shuffle: Reshuffle every epoch from (seed, epoch).
        drop_last: Drop each rank's last incomplete batch (and the samples that do not
            divide evenly among ranks).
        num_workers: Worker processes (threads with backend="thread"); "auto" uses the
            tuner's saved profile for this machine and dataset, else the CPUs available.
        prefetch_factor: Batches prepared ahead of the training step per worker (process or
            thread), as in DataLoader: ``prefetch_factor * num_workers`` batches are being
            decoded or wait on the host. The device stage copies a fixed 2 of them ahead.
            The thread backend makes no more ahead than a pass has batches, and refuses a
            ring of them larger than the machine's available memory.
        persistent_workers: Keep workers alive between epochs.
        pin_memory: Pin host batches; None means "when the device is CUDA".
        backend: "process" (torch DataLoader workers) or "thread".
        multiprocessing_context: The workers' start method, as in DataLoader: "fork",
            "spawn", "forkserver" or a multiprocessing context (stored as its method's
            name); None: ``fork`` on Linux unless this program set its own, else the
            platform default (see :mod:`fastload.sources.start`).
        seed: Base seed; the shuffle order and augmentation depend only on (seed, epoch,
            index). None: the Loader draws one from torch's default generator when it is
            made (as DataLoader does), so ``torch.manual_seed`` sets it and unseeded runs
            differ; ``loader.config.seed`` and ``state_dict()`` then hold what was drawn.
        device: Where batches are delivered; None means cuda if available, else cpu.
        normalize: How batches are normalized on the device: ``fl.Normalize(mean=,
            std=, dtype=)``; True (ImageNet's, float32) is ``fl.Normalize()``; False
            delivers the uint8 batch.
        shard: This rank's share of the samples: ``fl.Shard(rank=, world_size=,
            drop_uneven=, shuffle_seed=)``, DistributedSampler's settings; rank and world
            size not given are read from torch.distributed.
        on_error: "raise" or "skip" (a bad sample is replaced by another and counted).
        timeout: Seconds to wait for a worker's batch (0: forever, as in DataLoader). With
            ``num_workers=0`` (where DataLoader refuses one) it bounds the waits fastload
            makes in the calling thread (the LMDB guard's); a sample's own code there
            cannot be interrupted.
        stall_warning: Seconds without a batch before one warning naming the samples in
            flight and the workers loading them (0: never).
        return_index: Yield (images, targets, indices): the dataset index of each row,
            an int64 CPU tensor (to look up paths or other per-sample fields).
        decode: "cpu" (workers decode and resize) or "gpu" (workers read bytes and draw
            crops; the batch is decoded, resized, flipped and normalized on the CUDA
            device, see :mod:`fastload.device.gpudecode`; the train/eval presets only).
            "gpu" is not strict: nvImageCodec (nvJPEG) decodes corrupt JPEG data without
            an error and decodes crops as regions whatever ``FASTLOAD_ROI`` says, so a
            damaged file can reach a batch as wrong pixels instead of raising (or being
            skipped). For data not known to be intact, convert it with ``--verify`` first
            (every image decoded strictly), or keep ``decode="cpu"``.
        gpu_cpu_share: With ``decode="gpu"``, the share of each batch's GPU-decodable rows
            the workers decode themselves, by the CPU path, while the GPU decodes the rest:
            a number in [0, 1] (the first ``round(share * R)`` of a batch's R such rows;
            fully reproducible), ``"auto"`` (set from the measured rates of both so they add
            up, within [0, 0.95]; which rows the CPU took then depends on timing, and their
            pixels differ from the GPU's within its tolerance), or None (0: the GPU decodes
            every row it can take). Ignored with ``decode="cpu"``. See
            :mod:`fastload.device.gpudecode.share`.

    The old spellings ``mean``, ``std``, ``dtype`` (now in ``normalize``), ``rank``,
    ``world_size``, ``drop_uneven``, ``shuffle_seed`` (now in ``shard``) and
    ``start_method`` (now ``multiprocessing_context``) are still taken, and read, with a
    DeprecationWarning.
    """

    batch_size: int = 256
    shuffle: bool = False
    drop_last: bool = False
    num_workers: Union[int, str] = "auto"
    prefetch_factor: int = 2
    persistent_workers: bool = True
    pin_memory: bool | None = None
    backend: str = "process"
    multiprocessing_context: Any = None
    seed: int | None = None
    device: Any = None
    normalize: Normalize | bool = Normalize()
    shard: Shard = Shard()
    on_error: str = "raise"
    timeout: float = 0.0
    stall_warning: float = 60.0
    return_index: bool = False
    decode: str = "cpu"
    gpu_cpu_share: Union[float, str, None] = "auto"

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
        if self.seed is not None:
            positive_int("seed", 0)
            if self.seed >= SEED_LIMIT:
                raise ValueError(f"seed must be < 2**64 (torch's generators' range), got {self.seed!r}")
        check_device(self.device)
        if self.num_workers != "auto":
            positive_int("num_workers", 0)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.decode not in DECODES:
            raise ValueError(f"decode must be one of {DECODES}, got {self.decode!r}")
        object.__setattr__(self, "gpu_cpu_share", gpu_cpu_share(self.gpu_cpu_share))
        object.__setattr__(self, "multiprocessing_context", start_method_of(self.multiprocessing_context))
        object.__setattr__(self, "normalize", Normalize.of(self.normalize))
        object.__setattr__(self, "shard", Shard.of(self.shard))
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        for name in ("timeout", "stall_warning"):
            value = getattr(self, name)
            # NaN compares false with everything; past TIMEOUT_MAX a wait overflows when first made.
            nan = isinstance(value, float) and math.isnan(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or nan or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
            if value > threading.TIMEOUT_MAX:
                never = "forever" if name == "timeout" else "never"
                raise ValueError(
                    f"{name} must be a number of seconds >= 0, got {value!r}: more than the longest "
                    f"wait Python makes ({threading.TIMEOUT_MAX:.0f} s); 0 means {never}"
                )

    def replace(self, **changes: Any) -> LoaderConfig:
        """A copy with ``changes`` applied; unknown names raise TypeError listing the valid ones."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names - set(OLD))
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
        groups = {"normalize": self.normalize, "shard": self.shard}
        return dataclasses.replace(self, **upgrade(changes, groups, "LoaderConfig.replace", stacklevel=3))

    def __getattr__(self, name: str) -> Any:
        # Only for names that are not fields: the old spellings, read with a warning.
        return read_old(self, name)

    def to_dict(self) -> dict:
        """The fields as plain values (the groups as dicts, the device as its name): what
        ``fastload tune`` saves; ``LoaderConfig(**d)`` reads it back."""
        d = dataclasses.asdict(self)
        d["device"] = None if self.device is None else str(self.device)
        return d
