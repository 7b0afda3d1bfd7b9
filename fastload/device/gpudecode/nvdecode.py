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
            region = batch.region(r)
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
            out.append(None if img is None else self._tensor(img, self._expected(batch, r)))
        return out, [images, streams]

    @staticmethod
    def _expected(batch: EncodedBatch, r: int) -> tuple[int, int, int]:
        region = batch.region(r)
        if region is None:
            return int(batch.sizes[r, 0]), int(batch.sizes[r, 1]), 3
        return region[2] - region[0], region[3] - region[1], 3

    def _tensor(self, img: Any, shape: tuple[int, int, int]) -> torch.Tensor | None:
        if tuple(img.shape) != shape:  # e.g. a grey JPEG decoded to one channel
            return None
        if self.device.type == "cuda":
            return torch.from_dlpack(img)  # made ready on the current stream by the producer
        return torch.from_numpy(np.asarray(img))
