"""One batch request → one collated batch, with the per-sample error policy.

Runs wherever the batch is built (a DataLoader worker, the main process or a thread)
so every backend shares the same semantics.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .collate import fast_collate
from .datasets.base import sample_rng
from .sampler import BatchRequest

MAX_REPLACEMENTS = 10

Skipped = list  # [(index, "ErrorType: message"), ...]


class BatchFetcher(torch.utils.data.Dataset):
    """Wraps a dataset so DataLoader's ``__getitems__`` hook returns whole batches.

    Args:
        dataset: Anything with ``__len__`` and ``load(index, epoch, seed)``.
        seed: Base seed for augmentation randomness.
        on_error: "raise", or "skip" to replace a failing sample by a deterministic
            random other one (reported back with the batch).
    """

    def __init__(self, dataset: Any, seed: int, on_error: str = "raise") -> None:
        self.dataset = dataset
        self.seed = seed
        self.on_error = on_error

    def __len__(self) -> int:
        return len(self.dataset)

    def load(self, index: int, epoch: int, skipped: Skipped, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Sample ``index`` (or its replacement), written into ``out`` where possible."""
        kw = {} if out is None else {"out": out}
        try:
            return self.dataset.load(index, epoch, self.seed, **kw)
        except Exception as first:
            if self.on_error == "raise":
                raise
            error = first
        skipped.append((index, f"{type(error).__name__}: {error}"))
        rng = sample_rng(self.seed, epoch, index)
        for _ in range(MAX_REPLACEMENTS):
            other = int(rng.integers(len(self.dataset)))
            try:
                return self.dataset.load(other, epoch, self.seed, **kw)
            except Exception as e:
                skipped.append((other, f"{type(e).__name__}: {e}"))
                error = e
        raise RuntimeError(
            f"on_error='skip': sample {index} and {MAX_REPLACEMENTS} replacements failed; last: {error}"
        ) from error

    def __getitems__(self, request: BatchRequest) -> tuple[torch.Tensor, torch.Tensor, Skipped]:
        skipped: Skipped = []
        samples = [self.load(int(i), request.epoch, skipped) for i in request.indices]
        images, labels = fast_collate(samples)
        return images, labels, skipped

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.load(int(index), 0, [])


def identity(batch: Any) -> Any:
    return batch


class StreamBatches(torch.utils.data.IterableDataset):
    """Batches a TFRecordStream inside each worker (records sharded by rank and worker).

    With ``on_error="skip"`` a record that fails to decode is dropped and reported.
    """

    def __init__(self, stream: Any, batch_size: int, drop_last: bool, on_error: str = "raise") -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.on_error = on_error

    def __iter__(self):
        samples: list = []
        skipped: Skipped = []
        for n, _, _, image, label in self.stream.records():
            try:
                samples.append((self.stream.decode(n, image), label))
            except Exception as e:
                if self.on_error == "raise":
                    raise
                skipped.append((n, f"{type(e).__name__}: {e}"))
                continue
            if len(samples) == self.batch_size:
                yield (*fast_collate(samples), skipped)
                samples, skipped = [], []
        if samples and not self.drop_last:
            yield (*fast_collate(samples), skipped)
