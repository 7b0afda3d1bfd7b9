"""The batch workers hand the GPU decode stage: made by the worker side, :mod:`fastload.sources.packed`."""

from ...sources.packed import EncodedBatch, EncodedRow, gpu_decodable, pack

__all__ = ["EncodedBatch", "EncodedRow", "gpu_decodable", "pack"]
