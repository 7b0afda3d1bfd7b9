"""Multi-view batches through the device stage on simulated GPUs (tests/cudasim): every
view copied on the side stream, waited for, ``record_stream``-ed on the consumer, and
each reused host buffer rewritten only after all its views' copies read it."""

import numpy as np
import pytest
import torch

import fastload as fl

# The simulator (tests/cudasim and the ``sim`` fixture) comes with the gpu-sim branch.
pytest.importorskip("cudasim", reason="the CUDA simulator (tests/cudasim) is not in this checkout")

SHAPES = ((12, 10, 3), (6, 5, 3), (6, 5, 3))


class Views:
    """A fastload dataset of distinct random views (so a rewritten buffer always differs)."""

    def __len__(self) -> int:
        return 40

    def load(self, index: int, epoch: int = 0, seed: int = 0):
        rng = np.random.default_rng([index, epoch, seed])
        return tuple(rng.integers(0, 256, s, dtype=np.uint8) for s in SHAPES), index % 7


def _loader(backend, **kw):
    return fl.Loader(Views(), batch_size=4, num_workers=2, backend=backend, seed=0, shuffle=True, stall_warning=0,
                     **kw)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_views_on_the_device_are_the_cpu_paths(sim, backend):
    with _loader(backend, device="cpu") as cpu:
        want = [([v.clone() for v in views], y.clone()) for views, y in cpu]
    got = []
    with _loader(backend, device="cuda") as ld:
        for _ in range(2):  # a second pass: ring slots and pinned buffers reused
            got = []
            for views, y in ld:
                assert isinstance(views, list) and len(views) == 3 and all(v.device == ld.device for v in views)
                got.append(([v.double().sum(dim=(1, 2, 3)) for v in views], y * 1))  # read on the consumer
            ld.set_epoch(0)
    assert len(got) == len(want)
    for (views, y), (wviews, wy) in zip(got, want):
        assert torch.equal(y.cpu(), wy)
        for v, w in zip(views, wviews):
            torch.testing.assert_close(v.cpu(), w.double().sum(dim=(1, 2, 3)))
