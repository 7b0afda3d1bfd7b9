"""nvImageCodec's place on a simulated GPU, for ``Loader(decode="gpu")``.

Decodes with nvImageCodec's CPU backend (the pixels the tests compare), then writes each
image on the stream the executor passed as ``cuda_stream``, as the GPU decoder's kernels
would. Its own memory pool lives outside torch's allocator, as nvImageCodec's does: it is
counted by ``torch.cuda.mem_get_info`` and not by ``memory_reserved``; ``leak`` grows it by
that many bytes per batch (a decoder that keeps its buffers); ``refuse`` names rows it
gives back as None (for the executor's CPU fall-back).
"""

from __future__ import annotations

from typing import Any

import torch

from fastload.device.gpudecode import nvdecode

from .device import ACTIVE
from .tensor import kernel, new_on

POOL = 64 * 2**20  # the decoder's pool, reserved when it is made


def decoder(device: torch.device, threads: int | None = None, **hints: Any) -> Any:
    """What replaces ``fastload.device.gpudecode.executor.BatchDecoder``: the stand-in on a simulated
    GPU, nvImageCodec's CPU decoder on the CPU (``hints``: its preallocation hints)."""
    if device.type != "cuda":
        return nvdecode.BatchDecoder(device, threads, **hints)
    return StandInDecoder(device, threads or 0)


class StandInDecoder:
    leak = 0  # bytes the pool grows per batch
    refuse: frozenset = frozenset()  # encoded rows (by position in the batch) it cannot decode

    def __init__(self, device: torch.device, threads: int = 0) -> None:
        self.device, self.sim = ACTIVE[-1].device(device), ACTIVE[-1]
        self._cpu = nvdecode.BatchDecoder(torch.device("cpu"), threads)
        external = self.sim.allocator.external
        external[self.device.index] = external.get(self.device.index, 0) + POOL

    def decode(self, batch: Any, cuda_stream: int = 0) -> tuple[list, list]:
        stream = self.sim.streams[cuda_stream]  # an unknown handle fails here, as CUDA would
        if stream.device != self.device:
            raise RuntimeError(f"decoder of {self.device} handed a stream of {stream.device}")
        tensors, keep = self._cpu.decode(batch)
        out = []
        for r, t in enumerate(tensors):
            if t is None or r in self.refuse:
                out.append(None)
                continue
            image = new_on(t.clone(), self.device, stream, "decoded image")
            kernel("nvimgcodec decode", stream, [], [image])
            out.append(image)
        self.sim.allocator.external[self.device.index] += self.leak
        return out, keep
