"""GPU decode (``Loader(decode="gpu")``): workers read bytes and draw crops, the GPU decodes.

Workers plan each sample exactly as the CPU path does and send the batch's JPEG bytes
with each row's crop and flip (:class:`EncodedBatch`); the device driver runs the
:class:`GpuDecode` executor on its threads (each with its own decoder and stream, batches
handed over in order): it decodes the batch in one nvImageCodec call (a region where the
crop covers under half the image), then crops, resizes (antialiased bilinear) and flips on
the GPU; the driver normalizes into N×C×H×W channels_last, as it does every batch. What
the GPU decoder cannot take is decoded by the CPU path: in the worker when the header says
so (CMYK, progressive, not a JPEG, cut short), in the main process when the decoder refuses
it, each failure attributed to its sample under ``on_error``.

Only the presets' transforms can run there (:class:`GpuPipeline`), or a MultiView of them
(:class:`GpuViews`: each image decoded once, each view's rows cut from it). Without a GPU,
``FASTLOAD_GPU_DECODE_ON_CPU=1`` runs the same executor with nvImageCodec's CPU backend and
torch on the CPU (for tests).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ...encoded import EncodedBatch
from ...sources.packed import gpu_decodable
from .executor import GpuDecode
from .pipeline import REGION_MAX_AREA, Geometry, GpuPipeline, GpuRunnable, GpuViews

__all__ = [
    "REGION_MAX_AREA",
    "EncodedBatch",
    "Geometry",
    "GpuDecode",
    "GpuPipeline",
    "GpuRunnable",
    "GpuViews",
    "check_setup",
    "gpu_decodable",
    "on_cpu_allowed",
]

ON_CPU = "FASTLOAD_GPU_DECODE_ON_CPU"


def on_cpu_allowed() -> bool:
    """Whether ``FASTLOAD_GPU_DECODE_ON_CPU=1`` lets decode="gpu" run on the CPU (tests)."""
    return os.environ.get(ON_CPU, "").strip().lower() in ("1", "true", "yes", "on")


def check_setup(dataset: Any, device: torch.device, backend: str) -> GpuRunnable:
    """The GPU pipeline for a Loader with ``decode="gpu"``, or a clear error.

    Raises:
        ValueError: No CUDA device (and no ``FASTLOAD_GPU_DECODE_ON_CPU=1``), or transforms
            the executor cannot run.
        TypeError: A dataset that is not a fastload dataset.
        ImportError: nvImageCodec is not installed (names the wheels).
    """
    if device.type != "cuda" and not (device.type == "cpu" and on_cpu_allowed()):
        raise ValueError(
            f"decode='gpu' decodes on a CUDA device, but this Loader's device is {device}"
            f"{'' if torch.cuda.is_available() else ' (no CUDA here)'}: use decode='cpu'"
        )
    pipeline = GpuPipeline.of(dataset)
    from ...decode import roi
    from .nvdecode import cuda_hint

    try:
        roi.module()
    except ImportError as e:
        hint = cuda_hint() if device.type == "cuda" else "pip install 'fastload[roi]'"
        raise ImportError(f"decode='gpu' needs nvImageCodec: {hint} ({e})") from e
    return pipeline
