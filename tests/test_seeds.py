"""Seeds like DataLoader's: drawn from torch's generator when none is given, recorded in the
state and used by a resume; an explicit seed= wins; ranks that shard agree on one order."""

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.datasets.base import sample_rng

OPTS = dict(num_workers=0, device="cpu", normalize=False, batch_size=4, shuffle=True)


class Numbers(fl.ImageDataset):
    """Sample i: label i and a 2x2 image drawn from its augmentation rng."""

    def __init__(self, n):
        super().__init__(np.arange(n, dtype=np.int64))

    def load(self, index, epoch=0, seed=0):
        return sample_rng(seed, epoch, index).integers(0, 256, (2, 2, 3), dtype=np.uint8), index


def _pass(loader):
    batches = list(loader)
    return torch.cat([y for _, y in batches]).tolist(), torch.cat([x for x, _ in batches])


def _after_manual_seed(s, **kw):
    torch.manual_seed(s)
    with fl.Loader(Numbers(20), **{**OPTS, **kw}) as loader:
        assert isinstance(loader.config.seed, int)
        return _pass(loader)


def test_torch_manual_seed_sets_order_and_augmentation():
    (order, images), (order2, images2), (other, other_images) = (_after_manual_seed(s) for s in (1, 1, 2))
    assert order == order2 and torch.equal(images, images2)
    assert order != other and not torch.equal(images, other_images)


def test_unseeded_loaders_differ_and_an_explicit_seed_wins():
    with fl.Loader(Numbers(20), **OPTS) as a, fl.Loader(Numbers(20), **OPTS) as b:
        assert _pass(a)[0] != _pass(b)[0]
    assert _after_manual_seed(1, seed=3)[0] == _after_manual_seed(2, seed=3)[0]
    g = torch.get_rng_state()
    with fl.Loader(Numbers(20), generator=torch.Generator().manual_seed(5), **OPTS) as c, \
            fl.Loader(Numbers(20), generator=torch.Generator().manual_seed(5), **OPTS) as d:
        assert _pass(c)[0] == _pass(d)[0]
    assert torch.equal(g, torch.get_rng_state()), "generator=: torch's default generator is left alone"


def test_ranks_that_drew_their_own_seeds_deal_one_order():
    torch.manual_seed(0)
    r0 = fl.Loader(Numbers(20), shard=fl.Shard(rank=0, world_size=2), **OPTS)
    r1 = fl.Loader(Numbers(20), shard=fl.Shard(rank=1, world_size=2), **OPTS)  # drew another seed
    with r0, r1:
        assert r0.config.seed != r1.config.seed
        seen = _pass(r0)[0] + _pass(r1)[0]
    assert sorted(seen) == list(range(20)), "disjoint shards: both ranks deal one order"


def test_the_drawn_seed_is_in_the_state_and_a_resume_uses_it():
    torch.manual_seed(1)
    with fl.Loader(Numbers(20), **OPTS) as a:
        it = iter(a)
        next(it), next(it)
        state = a.state_dict()
        rest = [(x.clone(), y.clone()) for x, y in it]
    assert state["seed"] == a.config.seed
    torch.manual_seed(2)  # a new run draws another seed; the state's wins
    with fl.Loader(Numbers(20), **OPTS) as b:
        b.load_state_dict(state)
        assert b.config.seed == state["seed"]
        got = list(b)
    assert len(got) == len(rest) == 3
    assert all(torch.equal(x, gx) and torch.equal(y, gy) for (x, y), (gx, gy) in zip(rest, got))
    with fl.Loader(Numbers(20), seed=9, **OPTS) as c:
        with pytest.raises(ValueError, match=f"seed={state['seed']} but this loader has seed=9 .*leave seed= out"):
            c.load_state_dict(state)


def test_each_rank_resumes_with_its_own_drawn_seed():
    def run(rank, consumed=None, states=None):
        loader = fl.Loader(Numbers(24), shard=fl.Shard(rank=rank, world_size=2), **OPTS)
        if states is not None:
            loader.load_state_dict(states)
        with loader:
            it = iter(loader)
            for _ in range(consumed or 0):
                next(it)
            return loader.state_dict(), [x.clone() for x, _ in it], loader.config.seed

    (s0, rest0, seed0), (s1, rest1, seed1) = run(0, 1), run(1, 1)
    merged = fl.merge_states([s0, s1])
    assert merged["seed"] == [seed0, seed1] and merged["shuffle_seed"] == 0
    for rank, rest in ((0, rest0), (1, rest1)):
        _, got, seed = run(rank, states=[s0, s1])
        assert seed == (seed0, seed1)[rank]
        assert all(torch.equal(x, g) for x, g in zip(rest, got)) and len(got) == len(rest) == 2


def test_states_saved_before_shuffle_seed_and_drop_uneven_load():
    with fl.Loader(Numbers(20), seed=4, **OPTS) as a:
        it = iter(a)
        next(it)
        state = a.state_dict()
        rest = [y.tolist() for _, y in it]
    old = {k: v for k, v in state.items() if k not in ("shuffle_seed", "drop_uneven")}
    with fl.Loader(Numbers(20), seed=4, **OPTS) as b:
        b.load_state_dict(old)
        assert [y.tolist() for _, y in b] == rest
