"""A batch of JPEGs (whole or regions) → HWC uint8 tensors, in one nvImageCodec call.

On a CUDA device the decoder uses nvImageCodec's GPU backends in this order: nvJPEG's
hardware JPEG engines (where the GPU has them; a load hint leaves the rest of a batch to
the next), its CUDA decoder, its hybrid CPU/GPU decoder; enqueued on the stream of the
driver thread that decodes the batch (each thread has its own stream and decoder);
the tensors are zero-copy views of nvImageCodec's images (DLPack). On the CPU it uses the
CPU backend (libjpeg-turbo; pixels identical to fastload's TurboJPEG decode), the stand-in
the tests run. Images a backend refuses come back as None, for the executor's CPU fall-back.

Regions and fancy upsampling (libjpeg's triangle chroma filter, which fastload's CPU
decoders use) are decided per nvJPEG version when the decoder is built: nvJPEG >= 13.2
decodes a region of a chroma-subsampled JPEG as the whole decode would, so regions are
asked for as planned; older nvJPEG gets the region's outermost pixel wrong (nvImageCodec
refuses such regions unless told ``enable_roi_fancy_upsampling=1``), so the decoder asks
for the region padded outward by one MCU block and cuts the planned region inside it,
where the pixels are exact.

The GPU backends need nvImageCodec built for the machine's CUDA major version with
nvJPEG: ``pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg`` for CUDA 13 (``-cu12`` and
``nvidia-nvjpeg-cu12`` for CUDA 12).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import weakref
from typing import Any

import numpy as np
import torch

from ...decode import roi
from ...encoded import EncodedBatch
from ...sources.start import gpu_decoder_closed, gpu_decoder_opened

ROI_FANCY_NVJPEG = (13, 2)  # the first nvJPEG whose regions upsample chroma like a whole decode
MCU = 16  # the largest JPEG MCU (4:2:0): older nvJPEG's region error stays inside one block
REGION_MODES = ("plain", "padded", "whole")
HW_LOAD = 0.9  # share of a batch offered to the hardware engines first (adaptive from there)
BATCH_HINT = 256  # preallocation when the executor does not say (the loaders' usual batch)
SIZE_HINT = (512, 512)  # (height, width): a typical photo, for the hardware decoder's pools
NVJPEG_DISTRIBUTIONS = ("nvidia-nvjpeg", "nvidia-nvjpeg-cu13", "nvidia-nvjpeg-cu12")


def cuda_hint() -> str:
    """The pip command that installs nvImageCodec's GPU decoders for torch's CUDA."""
    major = int((torch.version.cuda or "12").split(".")[0])
    nvjpeg = "nvidia-nvjpeg" if major >= 13 else f"nvidia-nvjpeg-cu{major}"
    return f"pip install nvidia-nvimgcodec-cu{major} {nvjpeg}"


def default_threads() -> int:
    """CPU threads for nvImageCodec: at most 4. Its 0 means one per core, which competes with
    the loader's workers for every core (14 of 16 on the GPU machine)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def loaded_nvjpeg() -> str | None:
    """The path of the libnvjpeg this process has loaded (nvImageCodec loads it on import), or
    None: read from /proc/self/maps, so it is the library in use, not one on a search path."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith("libnvjpeg.so"):
                    return path
    except OSError:
        pass
    return None


def _library_version(path: str) -> tuple[int, int, int] | None:
    """nvjpegGetProperty(MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL) of the library at ``path``."""
    try:
        lib = ctypes.CDLL(path)  # already loaded: the same handle, nothing new mapped
        parts = []
        for prop in (0, 1, 2):
            value = ctypes.c_int()
            if lib.nvjpegGetProperty(prop, ctypes.byref(value)) != 0:
                return None
            parts.append(value.value)
        return parts[0], parts[1], parts[2]
    except (OSError, AttributeError):
        return None


def nvjpeg_version() -> tuple[int, int, int] | None:
    """(major, minor, patch) of the nvJPEG nvImageCodec decodes with, or None if unknown.

    The loaded library is asked first (the one in use); else the version of an installed
    nvJPEG wheel (the one nvImageCodec's wheel finds next to it)."""
    path = loaded_nvjpeg()
    found = _library_version(path) if path else None
    if found is not None:
        return found
    for dist in NVJPEG_DISTRIBUTIONS:
        try:
            parts = importlib.metadata.version(dist).split(".")
        except importlib.metadata.PackageNotFoundError:
            continue
        try:
            return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0
        except ValueError:
            continue
    return None


def region_mode(version: tuple[int, int, int] | None) -> str:
    """How a decoder on nvJPEG ``version`` asks for regions, with fancy upsampling on:
    "plain" (>= 13.2: exact regions), else "padded" (an unknown version too: a padded
    region is exact on every version, a plain one only on new ones)."""
    return "plain" if version is not None and version[:2] >= ROI_FANCY_NVJPEG else "padded"


def decoder_options(batch_size: int, image_size: tuple[int, int], fancy: bool = True) -> str:
    """nvImageCodec's options string for the nvJPEG decoders.

    Args:
        batch_size: The batch the hardware decoder preallocates for.
        image_size: (height, width) of a typical image, for the same.
        fancy: libjpeg's chroma upsampling (fastload's CPU decoders use it).
    """
    height, width = image_size
    if batch_size < 1 or height < 1 or width < 1:
        raise ValueError(f"preallocation hints must be positive, got batch_size={batch_size}, image_size={image_size}")
    # Regions with fancy upsampling asked for explicitly: on nvJPEG < 13.2 nvImageCodec would
    # refuse them (a warning per image); the decoder pads them there, so the edge error is cut off.
    return " ".join(
        [
            f":fancy_upsampling={int(fancy)}",
            "nvjpeg_cuda_decoder:enable_roi_fancy_upsampling=1",
            "nvjpeg_hw_decoder:enable_roi_fancy_upsampling=1",
            f"nvjpeg_hw_decoder:preallocate_batch_size={batch_size}",
            f"nvjpeg_hw_decoder:preallocate_width_hint={width}",
            f"nvjpeg_hw_decoder:preallocate_height_hint={height}",
        ]
    )


def gpu_backends(
    nv: Any, kinds: tuple[str, ...] = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU"), hw_load: float = HW_LOAD
) -> list[Any]:
    """nvImageCodec backends of ``kinds``, in order: the hardware engines with ``hw_load`` of a
    batch (adapted by nvImageCodec to keep every backend busy), the others what is left."""
    out = []
    for kind in kinds:
        if kind == "HW_GPU_ONLY" and len(kinds) > 1:
            out.append(
                nv.Backend(
                    nv.BackendKind.HW_GPU_ONLY,
                    load_hint=hw_load,
                    load_hint_policy=nv.LoadHintPolicy.ADAPTIVE_MINIMIZE_IDLE_TIME,
                )
            )
        else:
            out.append(nv.Backend(getattr(nv.BackendKind, kind)))
    return out


def padded(region: tuple[int, int, int, int], height: int, width: int, pad: int = MCU) -> tuple[int, int, int, int]:
    """``region`` (y0, x0, y1, x1) grown by ``pad`` on every side, clamped to the image."""
    y0, x0, y1, x1 = region
    return max(0, y0 - pad), max(0, x0 - pad), min(height, y1 + pad), min(width, x1 + pad)


class BatchDecoder:
    """Decodes the encoded rows of :class:`EncodedBatch` es on ``device``.

    Args:
        device: A CUDA device (GPU backends) or the CPU (its CPU backend).
        threads: CPU threads nvImageCodec may use; None: :func:`default_threads` (0 would
            mean one per core).
        batch_size: The batch size the hardware decoder preallocates for.
        image_size: (height, width) of a typical image, for the same.
        regions: How regions are asked for ("plain", "padded" or "whole"); None: decided by
            the nvJPEG version on CUDA (:func:`region_mode`), "plain" on the CPU backend
            (libjpeg-turbo's regions are exact).

    Raises:
        ImportError: nvImageCodec is missing, or cannot decode on this GPU (names the wheels).
        ValueError: A negative ``threads``, an unknown ``regions`` or non-positive hints.
    """

    def __init__(
        self,
        device: torch.device,
        threads: int | None = None,
        batch_size: int = BATCH_HINT,
        image_size: tuple[int, int] = SIZE_HINT,
        regions: str | None = None,
    ) -> None:
        if threads is not None and threads < 0:
            raise ValueError(f"threads must be >= 0 (0: one per core), got {threads}")
        if regions is not None and regions not in REGION_MODES:
            raise ValueError(f"regions must be one of {', '.join(REGION_MODES)}, got {regions!r}")
        nv = roi.module()
        self.device = device
        self.threads = default_threads() if threads is None else threads
        self._params = nv.DecodeParams(apply_exif_orientation=False)  # as TurboJPEG
        self.nvjpeg: tuple[int, int, int] | None = None
        if device.type == "cuda":
            options = decoder_options(batch_size, image_size)  # validates the hints
            self.nvjpeg = nvjpeg_version()  # nvImageCodec loaded it on import
            index = device.index if device.index is not None else torch.cuda.current_device()
            try:
                self._decoder = nv.Decoder(
                    device_id=index,
                    max_num_cpu_threads=self.threads,
                    backends=gpu_backends(nv),
                    options=options,
                )
            except Exception as e:
                raise ImportError(f"nvImageCodec cannot decode on {device} ({e}); {cuda_hint()}") from e
            self.regions = regions or region_mode(self.nvjpeg)
        else:
            self._decoder = nv.Decoder(
                device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                max_num_cpu_threads=self.threads,
                backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
            )
            self.regions = regions or "plain"
        self._nv = nv
        # Workers started while it lives come from a fork server (sources/start.py).
        gpu_decoder_opened()
        weakref.finalize(self, gpu_decoder_closed)
        # Region rows the backends refused and the decoder then decoded whole (counted, not
        # warned about per image; regions stay on for the next batch).
        self.regions_refused = 0

    def asked(self, batch: EncodedBatch, r: int) -> tuple[int, int, int, int] | None:
        """The region (y0, x0, y1, x1) the decoder asks nvImageCodec for row ``r``, or None
        for the whole image: the planned region, padded by one MCU ("padded"), or none."""
        region = batch.region(r)
        if region is None or self.regions == "whole":
            return None
        if self.regions == "plain":
            return region
        height, width = int(batch.sizes[r, 0]), int(batch.sizes[r, 1])
        grown = padded(region, height, width)
        return None if grown == (0, 0, height, width) else grown

    def decode(self, batch: EncodedBatch, cuda_stream: int = 0) -> tuple[list[torch.Tensor | None], list[Any]]:
        """Each encoded row of ``batch`` decoded (its region, or whole), as H×W×3 uint8 on
        the device, or None where it could not be decoded.

        On CUDA, call it with ``cuda_stream`` current: the tensors are ready on it.

        Returns:
            The tensors (a row with a region: the region's pixels), and what must stay alive
            until the work queued on them has run (nvImageCodec's images and code streams).
        """
        nv = self._nv
        streams, asked = [], []
        for r in range(len(batch.rows)):
            stream = nv.CodeStream(batch.encoded(r))
            ask = self.asked(batch, r)
            if ask is not None:
                stream = stream.get_sub_code_stream(region=nv.Region(start=ask[:2], end=ask[2:]))
            streams.append(stream)
            asked.append(ask)
        if not streams:
            return [], []
        try:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=cuda_stream)
        except Exception:  # refused as a whole: every row falls back
            return [None] * len(streams), streams
        out: list[torch.Tensor | None] = []
        for r, img in enumerate(images):
            out.append(None if img is None else self._cut(batch, r, img, asked[r]))
        keep: list[Any] = [images, streams]
        self._whole_for_refused_regions(batch, out, asked, keep, cuda_stream)
        return out, keep

    def _whole_for_refused_regions(
        self,
        batch: EncodedBatch,
        out: list[torch.Tensor | None],
        asked: list[tuple[int, int, int, int] | None],
        keep: list[Any],
        cuda_stream: int,
    ) -> None:
        """Decodes whole, on the device, the images whose region the backends refused, and puts
        the region's view of each in ``out``.

        A backend may refuse a region it would decode whole (nvJPEG < 13.2 with fancy
        upsampling, had the decoder not told nvImageCodec to take it); a whole decode stays on
        the GPU, where the CPU fall-back would load the sample again in this process. Only this
        batch's refused rows are decoded again: later batches still ask for regions. A row
        refused whole too (corrupt data) stays None, for the fall-back and its error.
        """
        again = [r for r, t in enumerate(out) if t is None and asked[r] is not None]
        if not again:
            return
        nv = self._nv
        streams = [nv.CodeStream(batch.encoded(r)) for r in again]
        try:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=cuda_stream)
        except Exception:
            return
        keep += [images, streams]
        for r, img in zip(again, images):
            out[r] = None if img is None else self._cut(batch, r, img, None)
            self.regions_refused += out[r] is not None

    def _cut(
        self, batch: EncodedBatch, r: int, img: Any, asked: tuple[int, int, int, int] | None
    ) -> torch.Tensor | None:
        """Row ``r``'s pixels from its decoded ``img`` (the ``asked`` region, or the whole
        image): the planned region's view where it has one, else the whole image."""
        whole = (int(batch.sizes[r, 0]), int(batch.sizes[r, 1]))
        got = (int(img.shape[0]), int(img.shape[1]))
        if asked is not None and got == (asked[2] - asked[0], asked[3] - asked[1]):
            oy, ox = asked[0], asked[1]
        elif got == whole:
            oy, ox = 0, 0
        else:
            return None
        t = self._tensor(img, (*got, 3))
        region = batch.region(r)
        if t is None or region is None:
            return t
        y0, x0, y1, x1 = region
        return t[y0 - oy : y1 - oy, x0 - ox : x1 - ox]

    def _tensor(self, img: Any, shape: tuple[int, int, int]) -> torch.Tensor | None:
        if tuple(img.shape) != shape:  # e.g. a grey JPEG decoded to one channel
            return None
        if self.device.type == "cuda":
            return torch.from_dlpack(img)  # made ready on the current stream by the producer
        return torch.from_numpy(np.asarray(img))
