"""Datasets and consumer loops the simulator scenarios share (each a real Loader run)."""

from __future__ import annotations

import numpy as np
import torch

import fastload as fl

SHAPE = (12, 10, 3)


class Pixels:
    """A fastload dataset of distinct random images (so a rewritten buffer always differs)."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, index: int, epoch: int = 0, seed: int = 0):
        rng = np.random.default_rng([index, epoch, seed])
        return rng.integers(0, 256, SHAPE, dtype=np.uint8), index % 7


def loader(backend: str = "thread", **kw) -> fl.Loader:
    opts = dict(batch_size=4, num_workers=2, backend=backend, seed=0, shuffle=True, stall_warning=0)
    opts.update(kw)
    return fl.Loader(Pixels(opts.pop("n", 40)), **opts)


def expected(backend: str = "thread", epoch: int = 0, **kw) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same Loader's batches on the CPU."""
    with loader(backend, device="cpu", **kw) as cpu:
        cpu.set_epoch(epoch)
        return [(x.clone(), y.clone()) for x, y in cpu]


def read_on_consumer(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A training step's reads: kernels on the current stream, results kept on the device."""
    return x.double().sum(dim=(1, 2, 3)), y * 1
