"""The worker side of ``decode="gpu"``: read bytes, check headers, draw crops and flips.

Each sample is planned exactly as the CPU path plans it (same reads, same draws from the
same generator); samples the GPU decoder takes travel as bytes, the others are loaded by
the CPU path here, with the error policy, and travel as pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...decode import ImageHeader
from ...decode.header import check_jpeg_complete
from ...sources.fetch import BatchFetcher, describe, put
from ...sources.inflight import InFlight
from ...sources.sampler import BatchRequest
from ...targets import Target, TargetSpec, as_target, fill
from .encoded import EncodedBatch, EncodedRow, pack
from .pipeline import GpuPipeline


def gpu_decodable(header: ImageHeader) -> bool:
    """Whether the GPU decoder gets this image: a baseline JPEG, grey or colour.

    CMYK/YCCK, progressive JPEGs (which nvJPEG's GPU-only and hardware decoders refuse)
    and other formats are decoded on the CPU, in the worker.
    """
    return header.format == "jpeg" and header.components in (1, 3) and not header.progressive


class EncodingFetcher(BatchFetcher):
    """Builds :class:`EncodedBatch` es in the workers for the GPU decode stage.

    Args:
        dataset: A fastload dataset that plans its samples (checked by :meth:`GpuPipeline.of`).
        seed: Base seed for augmentation randomness.
        on_error: "raise" or "skip", applied to the samples loaded on the CPU here.
        inflight: Table the loading worker marks.
        pipeline: The transforms as the GPU stage runs them.
    """

    def __init__(self, dataset: Any, seed: int, on_error: str, inflight: InFlight, pipeline: GpuPipeline) -> None:
        super().__init__(dataset, seed, on_error, inflight)
        self.pipeline = pipeline

    def _plan_row(self, row: int, index: int, epoch: int, seed: int, worker: int) -> tuple[EncodedRow, Target] | None:
        """Sample ``index`` planned for the GPU, or None when the CPU path must load it."""
        self.inflight.begin(worker, index, epoch)
        try:
            plan = self.dataset.plan(index, epoch, seed)
            header = plan.header
            if not gpu_decodable(header):
                return None
            check_jpeg_complete(plan.data)  # a JPEG cut short is the CPU path's error to report
            geometry = self.pipeline.geometry(plan.crop, header.height, header.width)
            flip = self.pipeline.flip.draw(plan.rng) if self.pipeline.flip is not None else False
            return EncodedRow(row, plan.data, header.height, header.width, geometry, flip), as_target(plan.label)
        except Exception:  # the CPU path meets it again and applies the error policy
            return None
        finally:
            self.inflight.end(worker)

    def fetch(self, request: BatchRequest, worker: int = 0, pin: bool | None = None) -> EncodedBatch:
        """The EncodedBatch of ``request``: bytes for the GPU, pixels for the rest."""
        epoch, n = request.epoch, len(request.indices)
        out_h, out_w = self.pipeline.out_size
        encoded: list[EncodedRow] = []
        decoded: list[tuple[int, np.ndarray]] = []
        targets: list[Target] = []
        indices = np.empty(n, np.int64)
        skipped = []
        for j, index in enumerate(int(i) for i in request.indices):
            planned = self._plan_row(j, index, epoch, request.seed, worker)
            if planned is not None:
                encoded.append(planned[0])
                targets.append(planned[1])
                indices[j] = index
                continue
            image = np.empty((out_h, out_w, 3), np.uint8)
            item = self.load(index, epoch, worker, image, seed=request.seed)  # the CPU path, as decode="cpu" loads it
            put(image, item, self.dataset)
            decoded.append((j, image))
            targets.append(item.label)
            indices[j] = item.index
            skipped.extend(item.skipped)
        labels = TargetSpec.of(targets[0]).alloc(n)
        fill(labels, targets, lambda j: f"sample {int(indices[j])} ({describe(self.dataset, int(indices[j]))})")
        return pack(encoded, decoded, labels, torch.from_numpy(indices), epoch, tuple(skipped), (out_h, out_w))
