"""What crosses to the workers: each batch request carries its epoch, seed and rank (issue 33),
so a new seed or rank deals new batches from the workers already running."""

import fastload as fl
from fastload.sources.request import BatchRequest, batched

import numpy as np

from conftest import write_folder

OPTS = dict(batch_size=4, device="cpu", normalize=False, return_index=True, shuffle=True)


def _batches(loader):
    return [(x.clone(), y.clone(), i.clone()) for x, y, i in loader]


def _same(a, b):
    import torch

    return len(a) == len(b) and all(torch.equal(p, q) for x, y in zip(a, b) for p, q in zip(x, y))


def test_a_loaded_seed_starts_no_new_workers(tmp_path):
    root = write_folder(tmp_path / "f", num_classes=2, per_class=6)
    ds = fl.ImageFolder(root, fl.transforms.train(32))
    with fl.Loader(ds, seed=11, num_workers=1, **OPTS) as saver:
        head = [next(iter(saver))]
        state = saver.state_dict()
    with fl.Loader(ds, seed=11, num_workers=1, **OPTS) as ref:
        ref.load_state_dict(state)
        want = _batches(ref)
    with fl.Loader(ds, num_workers=1, **OPTS) as drawn:  # a seed of its own, drawn: the state's wins
        first = _batches(drawn)
        pids = set(drawn._source.inflight.pids().values())
        drawn.load_state_dict(state)
        assert drawn.config.seed == 11
        got = _batches(drawn)
        assert set(drawn._source.inflight.pids().values()) == pids and pids, "the same worker"
    assert _same(got, want) and not _same(first[: len(want)], want) and head


def test_requests_are_numbered_and_carry_their_seed():
    got = list(batched(3, np.arange(10), 4, seed=9, rank=1, first=2))
    assert [len(r) for r in got] == [4, 4, 2] and [r.number for r in got] == [2, 3, 4]
    assert all(isinstance(r, BatchRequest) and (r.epoch, r.seed, r.rank) == (3, 9, 1) for r in got)
