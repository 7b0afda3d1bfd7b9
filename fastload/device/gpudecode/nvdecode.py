"""A batch of JPEGs (whole or regions) → HWC uint8 tensors, in one nvImageCodec call.

On a CUDA device the decoder uses nvImageCodec's GPU backends (nvJPEG's hardware
decoder where the GPU has one, its CUDA and hybrid decoders otherwise), enqueued on the
driver's stream; the tensors are zero-copy views of nvImageCodec's images (DLPack). On the
CPU it uses the CPU backend (libjpeg-turbo; pixels identical to fastload's TurboJPEG
decode), the stand-in the tests run. Images a backend refuses come back as None, for the
executor's CPU fall-back.

The GPU backends need nvImageCodec built for the machine's CUDA major version with
nvJPEG: ``pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg`` for CUDA 13 (``-cu12`` and
``nvidia-nvjpeg-cu12`` for CUDA 12).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...decode import roi
from ...sources.packed import EncodedBatch

# nvJPEG upsamples chroma by replication unless asked for libjpeg's triangle filter,
# which fastload's CPU decoders use.
OPTIONS = ":fancy_upsampling=1"


def cuda_hint() -> str:
    """The pip command that installs nvImageCodec's GPU decoders for torch's CUDA."""
    major = int((torch.version.cuda or "12").split(".")[0])
    nvjpeg = "nvidia-nvjpeg" if major >= 13 else f"nvidia-nvjpeg-cu{major}"
    return f"pip install nvidia-nvimgcodec-cu{major} {nvjpeg}"


class BatchDecoder:
    """Decodes the encoded rows of :class:`EncodedBatch` es on ``device``.

    Args:
        device: A CUDA device (GPU backends) or the CPU (its CPU backend).
        threads: CPU threads nvImageCodec may use (0: one per core).

    Raises:
        ImportError: nvImageCodec is missing, or cannot decode on this GPU (names the wheels).
    """

    def __init__(self, device: torch.device, threads: int = 0) -> None:
        nv = roi.module()
        self.device = device
        self._params = nv.DecodeParams(apply_exif_orientation=False)  # as TurboJPEG
        if device.type == "cuda":
            kinds = (nv.BackendKind.HW_GPU_ONLY, nv.BackendKind.GPU_ONLY, nv.BackendKind.HYBRID_CPU_GPU)
            index = device.index if device.index is not None else torch.cuda.current_device()
            try:
                self._decoder = nv.Decoder(
                    device_id=index,
                    max_num_cpu_threads=threads,
                    backends=[nv.Backend(k) for k in kinds],
                    options=OPTIONS,
                )
            except Exception as e:
                raise ImportError(f"nvImageCodec cannot decode on {device} ({e}); {cuda_hint()}") from e
        else:
            self._decoder = nv.Decoder(
                device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                max_num_cpu_threads=threads,
                backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
            )
        self._nv = nv
        self._regions = True  # False once the backends refused regions that decode whole

    def decode(self, batch: EncodedBatch, cuda_stream: int = 0) -> tuple[list[torch.Tensor | None], list[Any]]:
        """Each encoded row of ``batch`` decoded (its region, or whole), as H×W×3 uint8 on
        the device, or None where it could not be decoded.

        On CUDA, call it with ``cuda_stream`` current: the tensors are ready on it.

        Returns:
            The tensors, and what must stay alive until the work queued on them has run
            (nvImageCodec's images and code streams).
        """
        nv = self._nv
        streams = []
        for r in range(len(batch.rows)):
            stream = nv.CodeStream(batch.encoded(r))
            region = batch.region(r) if self._regions else None
            if region is not None:
                stream = stream.get_sub_code_stream(region=nv.Region(start=region[:2], end=region[2:]))
            streams.append(stream)
        if not streams:
            return [], []
        try:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=cuda_stream)
        except Exception:  # refused as a whole: every row falls back
            return [None] * len(streams), streams
        out: list[torch.Tensor | None] = []
        for r, img in enumerate(images):
            out.append(None if img is None else self._cut(batch, r, img))
        keep: list[Any] = [images, streams]
        self._whole_for_refused_regions(batch, out, keep, cuda_stream)
        return out, keep

    def _whole_for_refused_regions(
        self, batch: EncodedBatch, out: list[torch.Tensor | None], keep: list[Any], cuda_stream: int
    ) -> None:
        """Decodes whole, on the device, the images whose region the backends refused, and puts
        the region's view of each in ``out``.

        nvJPEG before 13.2 refuses a region of a chroma-subsampled JPEG (most photos) when
        fancy upsampling is on, since its region upsampling is wrong on the region's edge
        (nvImageCodec's ``enable_roi_fancy_upsampling``); a whole decode is right and stays on
        the GPU, where the CPU fall-back would load the sample again in this process. A row
        refused whole too (corrupt data) stays None, for the fall-back and its error.
        """
        again = [r for r, t in enumerate(out) if t is None and batch.region(r) is not None]
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
            out[r] = None if img is None else self._cut(batch, r, img)
        if any(out[r] is not None for r in again):
            # Refused as regions, decoded whole: the backend refuses regions, not these images,
            # so later batches ask for whole images at once (one call, and no warning per row).
            self._regions = False

    def _cut(self, batch: EncodedBatch, r: int, img: Any) -> torch.Tensor | None:
        """Row ``r``'s pixels from its decoded ``img``: its region's view when decoded whole."""
        region = batch.region(r)
        whole = (int(batch.sizes[r, 0]), int(batch.sizes[r, 1]), 3)
        if region is None:
            return self._tensor(img, whole)
        y0, x0, y1, x1 = region
        if tuple(img.shape) == (y1 - y0, x1 - x0, 3):
            return self._tensor(img, (y1 - y0, x1 - x0, 3))
        t = self._tensor(img, whole)
        return None if t is None else t[y0:y1, x0:x1]

    def _tensor(self, img: Any, shape: tuple[int, int, int]) -> torch.Tensor | None:
        if tuple(img.shape) != shape:  # e.g. a grey JPEG decoded to one channel
            return None
        if self.device.type == "cuda":
            return torch.from_dlpack(img)  # made ready on the current stream by the producer
        return torch.from_numpy(np.asarray(img))
