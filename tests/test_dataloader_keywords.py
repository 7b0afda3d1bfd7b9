"""DataLoader's keywords on fl.Loader: sampler=None or a DistributedSampler with DataLoader's
meaning, loader.sampler as DataLoader's, the rest an error saying what to write instead."""

import multiprocessing

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, Subset

import fastload as fl
from fastload.datasets.base import sample_rng
from fastload.sources.start import worker_start_method

OPTS = dict(num_workers=0, device="cpu", normalize=False)


class Numbers(fl.ImageDataset):
    """Sample i: label i and a 2x2 image drawn from its augmentation rng."""

    def __init__(self, n):
        super().__init__(np.arange(n, dtype=np.int64))

    def load(self, index, epoch=0, seed=0):
        return sample_rng(seed, epoch, index).integers(0, 256, (2, 2, 3), dtype=np.uint8), index


def labels(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [i for _, y in loader for i in y.tolist()]


def _dist(ds, rank, **kw):
    return DistributedSampler(ds, num_replicas=2, rank=rank, **kw)


@pytest.mark.parametrize("keyword,value,says", [
    ("collate_fn", lambda b: b, "fastload collates .* transform each sample in the dataset"),
    ("worker_init_fn", print, "print: fastload seeds numpy and random in each worker"),
    ("pin_memory_device", "cuda:1", "write device='cuda:1'"),
    ("batch_sampler", [[0, 1]], "give batch_size= and drop_last="),
    ("batch_size", None, "fastload always batches"),
    ("sampler", "random", r"RandomSampler\(...\): write shuffle=True"),
    ("sampler", "sequential", "leave sampler out"),
    ("sampler", "subset", r"fl.Loader\(torch.utils.data.Subset\(dataset, indices\), shuffle=True\)"),
    ("sampler", "weighted", "WeightedRandomSampler's order cannot be followed.*Subset"),
    ("sampler", "reordering", "overrides DistributedSampler's order"),
])
def test_keywords_fastload_cannot_honour_say_what_to_write(keyword, value, says):
    ds = Numbers(8)

    class Reordering(DistributedSampler):
        def __iter__(self):
            return iter(range(len(self)))

    samplers = {"random": torch.utils.data.RandomSampler(ds), "sequential": torch.utils.data.SequentialSampler(ds),
                "subset": torch.utils.data.SubsetRandomSampler([1, 2]),
                "weighted": torch.utils.data.WeightedRandomSampler([1.0] * 8, 8),
                "reordering": Reordering(ds, num_replicas=1, rank=0)}
    value = samplers.get(value, value) if isinstance(value, str) else value
    with pytest.raises(TypeError, match=f"fl.Loader does not take {keyword}=.*{says}"):
        fl.Loader(ds, **OPTS, **{keyword: value})


def test_dataloader_defaults_change_nothing():
    ds = Numbers(10)
    defaults = dict(batch_sampler=None, collate_fn=None, worker_init_fn=None, generator=None,
                    pin_memory_device="", prefetch_factor=None, shuffle=None, in_order=True,
                    multiprocessing_context=None)
    with fl.Loader(ds, batch_size=3, seed=1, **OPTS, **defaults) as a, fl.Loader(ds, batch_size=3, seed=1, **OPTS) as b:
        assert labels(a) == labels(b) == list(range(10))
        assert a.config == b.config


def test_multiprocessing_context_is_the_start_method():
    ds = Numbers(4)
    with fl.Loader(ds, multiprocessing_context="spawn", **OPTS) as a, \
            fl.Loader(ds, multiprocessing_context=multiprocessing.get_context("forkserver"), **OPTS) as b:
        assert (a.config.multiprocessing_context, b.config.multiprocessing_context) == ("spawn", "forkserver")
    with pytest.raises(ValueError, match="multiprocessing_context='spawn' and start_method='fork' disagree"):
        fl.Loader(ds, multiprocessing_context="spawn", start_method="fork", **OPTS)
    # A context and the old spelling of its method agree (they did before the rename); one that
    # disagrees is named by its method, not its repr.
    with pytest.warns(DeprecationWarning, match="start_method"), \
            fl.Loader(ds, multiprocessing_context=multiprocessing.get_context("spawn"), start_method="spawn",
                      **OPTS) as c:
        assert c.config.multiprocessing_context == "spawn"
    with pytest.raises(ValueError, match="multiprocessing_context='forkserver' and start_method='spawn' disagree"):
        fl.Loader(ds, multiprocessing_context=multiprocessing.get_context("forkserver"), start_method="spawn", **OPTS)


def test_sampler_none_reads_the_whole_dataset_in_every_process(monkeypatch):
    """DataLoader's meaning: without a sampler every rank reads everything (main.py's
    aux_val_loader); without the keyword, fastload shards by rank under torch.distributed."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    ds = Numbers(5)
    with fl.Loader(ds, batch_size=2, sampler=None, **OPTS) as whole, fl.Loader(ds, batch_size=2, **OPTS) as shard:
        assert (whole.rank, whole.world_size, labels(whole)) == (0, 1, [0, 1, 2, 3, 4])
        assert (shard.rank, shard.world_size, labels(shard)) == (1, 2, [1, 3, 0])


@pytest.mark.parametrize("n,drop_last", [(41, False), (41, True), (40, True)])
def test_distributed_sampler_deals_as_it_does(n, drop_last):
    ds = Numbers(n)
    for shuffle in (False, True):
        seen = []
        for rank in (0, 1):
            sampler = _dist(ds, rank, shuffle=shuffle, seed=5, drop_last=drop_last)
            with fl.Loader(ds, batch_size=6, sampler=sampler, **OPTS) as loader:
                assert (loader.rank, loader.world_size, loader.config.shuffle) == (rank, 2, shuffle)
                assert len(loader.sampler) == len(sampler), "len(loader.sampler): this rank's samples"
                got = labels(loader)
                assert len(got) == len(sampler) and len(loader) == -(-len(sampler) // 6), "the last batch is kept"
                if not shuffle:
                    assert got == list(sampler) == list(loader.sampler), "DistributedSampler's exact order"
                seen.append(got)
        assert not set(seen[0]) & set(seen[1]) or not drop_last
        assert set(seen[0] + seen[1]) == set(range(n if not drop_last else n - n % 2))


def test_drop_uneven_with_the_loaders_drop_last_drops_the_partial_batch():
    ds = Numbers(41)
    with fl.Loader(ds, batch_size=6, drop_last=True, sampler=_dist(ds, 0, drop_last=True), **OPTS) as loader:
        assert len(loader.sampler) == 20 and len(loader) == 3 and len(labels(loader)) == 18
    with fl.Loader(ds, batch_size=6, shard=fl.Shard(rank=1, world_size=2, drop_uneven=True), **OPTS) as loader:
        assert len(loader.sampler) == 20 and len(labels(loader)) == 20 and 40 not in labels(loader)


def test_distributed_sampler_keeps_its_seed_and_refuses_contradictions():
    ds = Numbers(12)
    with fl.Loader(ds, batch_size=4, sampler=_dist(ds, 0, seed=3), **OPTS) as a, \
            fl.Loader(ds, batch_size=4, sampler=_dist(ds, 0, seed=3), **OPTS) as b, \
            fl.Loader(ds, batch_size=4, sampler=_dist(ds, 0, seed=4), **OPTS) as c:
        assert labels(a) == labels(b) != labels(c), "the order comes from the sampler's seed"
        assert a.config.seed != b.config.seed, "augmentation: drawn from torch's generator"
    with pytest.raises(ValueError, match=r"exclusive with shuffle .*shuffle=True: .* shuffle=\(sampler is None\)"):
        fl.Loader(ds, sampler=_dist(ds, 0), shuffle=True, **OPTS)
    with pytest.raises(ValueError, match="shard's rank=1 disagrees with the DistributedSampler's 0"):
        fl.Loader(ds, sampler=_dist(ds, 0), shard=fl.Shard(rank=1), **OPTS)
    with pytest.raises(ValueError, match="DistributedSampler is over a dataset of 5 samples, the Loader's has 12"):
        fl.Loader(ds, sampler=_dist(Numbers(5), 0), **OPTS)


def test_distributed_sampler_set_epoch_drives_the_passes():
    ds = Numbers(16)
    sampler = _dist(ds, 1)
    sampler.set_epoch(4)  # before the Loader is made
    with fl.Loader(ds, batch_size=4, sampler=sampler, **OPTS) as loader, \
            fl.Loader(ds, batch_size=4, sampler=_dist(ds, 1), **OPTS) as ref:
        assert labels(loader) == labels(ref, 4) and loader.epoch == 4
        sampler.set_epoch(2)
        assert labels(loader) == labels(ref, 2) and loader.epoch == 2
        assert labels(loader) == labels(ref, 3), "without set_epoch, the next epoch"


def test_set_epoch_after_a_resume_keeps_the_resumed_pass():
    """A DDP script loads the loaders' states, then calls train_sampler.set_epoch(epoch) as in every epoch."""
    ds = Numbers(32)
    states, passes = [], []
    for rank in (0, 1):
        sampler = _dist(ds, rank)
        with fl.Loader(ds, batch_size=4, sampler=sampler, **OPTS) as loader:
            sampler.set_epoch(2)
            it = iter(loader)
            head = [next(it)[1].tolist() for _ in range(2)]
            states.append(loader.state_dict())
            passes.append((head, [y.tolist() for _, y in it]))
    sampler = _dist(ds, 0)
    with fl.Loader(ds, batch_size=4, sampler=sampler, **OPTS) as resumed:
        resumed.load_state_dict(states)
        sampler.set_epoch(2)
        assert [y.tolist() for _, y in resumed] == passes[0][1], "the rest of epoch 2"
        sampler.set_epoch(3)
        assert [y.tolist() for _, y in resumed] == labels_of(ds, 0, 3), "then epoch 3, whole"
    early = _dist(ds, 0)
    early.set_epoch(7)  # before the state is loaded: the state wins
    with fl.Loader(ds, batch_size=4, sampler=early, **OPTS) as resumed:
        resumed.load_state_dict(states)
        assert [y.tolist() for _, y in resumed] == passes[0][1]


def labels_of(ds, rank, epoch):
    with fl.Loader(ds, batch_size=4, sampler=_dist(ds, rank), **OPTS) as loader:
        loader.set_epoch(epoch)
        return [y.tolist() for _, y in loader]


def test_loader_sampler_set_epoch_of_the_same_epoch_repeats_it():
    ds = Numbers(12)
    with fl.Loader(ds, batch_size=4, shuffle=True, seed=0, **OPTS) as loader:
        first = labels(loader)
        loader.sampler.set_epoch(0)  # Lightning, resuming: the epoch that just ran
        assert labels(loader) == first and loader.epoch == 0
        loader.batch_sampler.set_epoch(5)
        loader.set_epoch(1)  # the loader's own, called last, wins
        assert loader.epoch is not None and labels(loader) and loader.epoch == 1


def test_loader_sampler_is_dataloaders_sampler():
    ds = Numbers(10)
    with fl.Loader(ds, batch_size=4, shuffle=True, seed=2, shard=fl.Shard(rank=1, world_size=2), **OPTS) as loader:
        assert len(loader.sampler) == 5 and len(loader.batch_sampler) == len(loader) == 2
        assert (loader.sampler.rank, loader.sampler.num_replicas, loader.sampler.shuffle) == (1, 2, True)
        loader.sampler.set_epoch(3)
        assert list(loader.sampler) == labels(loader) and loader.epoch == 3


def test_a_subset_of_a_fastload_dataset_keeps_the_loaders_epochs():
    """Subset.__getitem__ would load every epoch with the dataset's own epoch 0: the same crops."""
    ds = Numbers(10)
    part = Subset(Subset(ds, [9, 7, 5, 3, 1]), [4, 0, 2])
    with fl.Loader(part, batch_size=3, seed=1, **OPTS) as loader:
        (x0, y0), = list(loader)
        (x1, y1), = list(loader)
    assert y0.tolist() == y1.tolist() == [1, 9, 5]
    assert not torch.equal(x0, x1), "another epoch, other augmentation draws"
    want = np.stack([ds.load(i, 1, 1)[0] for i in (1, 9, 5)])
    assert np.array_equal(x1.permute(0, 2, 3, 1).numpy(), want), "epoch 1 of the original samples"


def test_workers_fork_on_linux_in_a_process_started_by_spawn(monkeypatch):
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # started by torch.mp.spawn
    assert worker_start_method(None) == "fork"
    assert worker_start_method("forkserver") == "forkserver"
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)  # this program set spawn itself
    assert worker_start_method(None) == "spawn"


def test_the_programs_start_method_is_read_not_fixed(monkeypatch):
    def get_start_method(allow_none=False):
        assert allow_none, "get_start_method() without allow_none fixes the program's start method"
        return None

    monkeypatch.setattr(multiprocessing, "get_start_method", get_start_method)
    with fl.Loader(Numbers(6), batch_size=3, num_workers=1, device="cpu", seed=0) as loader:
        assert labels(loader) == list(range(6))
