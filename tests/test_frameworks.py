"""DataLoader habits: option values users pass, the attributes frameworks read, Lightning."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastload as fl

import refs

HERE = os.path.dirname(__file__)


class Squares(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((4, 4, 3), i, np.uint8), i


def test_torch_dtypes_are_accepted():
    assert fl.LoaderConfig(normalize=fl.Normalize(dtype=torch.float16)).normalize.dtype == "float16"
    with fl.Loader(Squares(4), batch_size=2, num_workers=0, device="cpu",
                   normalize=fl.Normalize(dtype=torch.bfloat16)) as loader:
        x, _ = next(iter(loader))
    assert x.dtype == torch.bfloat16
    assert fl.Normalizer(dtype=torch.float16)(torch.zeros(1, 2, 2, 3, dtype=torch.uint8)).dtype == torch.float16
    with pytest.raises(ValueError, match="dtype must be one of .* got torch.int8"):
        fl.Normalize(dtype=torch.int8)


@pytest.mark.parametrize("option,message", [
    (dict(normalize={"mean": (123.7, 116.3, 103.5)}), r"mean \(123.7, 116.3, 103.5\) is outside \[0, 1\].*divide "
                                                      r"by 255: \(0.4851, 0.4561, 0.4059\)"),
    (dict(normalize={"std": [58.4, 57.1, 57.4]}), r"std \[58.4, 57.1, 57.4\] is outside \[0, 1\].*divide by 255"),
    (dict(normalize={"mean": (-0.5, 0.5, 0.5)}), r"mean \(-0.5, 0.5, 0.5\) is outside \[0, 1\]"),
    (dict(shuffle="yes"), "shuffle must be True or False, got 'yes'"),
    (dict(drop_last=1), "drop_last must be True or False, got 1"),
    (dict(normalize=None), r"normalize must be True, False or fl.Normalize\(mean=..., std=..., dtype=...\), got None"),
    (dict(persistent_workers="false"), "persistent_workers must be True or False, got 'false'"),
    (dict(return_index=0), "return_index must be True or False, got 0"),
    (dict(pin_memory="auto"), "pin_memory must be True, False or None .* got 'auto'"),
])
def test_implausible_values_are_errors_naming_them(option, message):
    with pytest.raises(ValueError, match=message):
        fl.LoaderConfig(**option)
    with pytest.raises(ValueError, match=message):
        fl.Loader(Squares(4), device="cpu", **option)


def test_plausible_values_pass_and_are_normalized():
    cfg = fl.LoaderConfig(normalize=fl.Normalize(mean=[0.5, 0.5, 0.5], std=np.array([0.25, 0.25, 0.25])),
                          shuffle=np.True_, shard=fl.Shard(drop_uneven=np.True_))
    assert cfg.normalize.mean == (0.5, 0.5, 0.5) and cfg.normalize.std == (0.25, 0.25, 0.25)
    assert cfg.shuffle is True and cfg.shard.drop_uneven is True and fl.LoaderConfig(normalize=np.False_).normalize is False


def test_dataloader_attributes_frameworks_read():
    ds = Squares(10)
    with fl.Loader(ds, batch_size=4, drop_last=True, num_workers=2, backend="thread", device="cpu",
                   shard=fl.Shard(rank=1, world_size=2)) as loader:
        assert loader.dataset is ds
        assert (loader.batch_size, loader.drop_last, loader.num_workers) == (4, True, 2)
        assert loader.persistent_workers is True and loader.pin_memory is False
        assert isinstance(loader.batch_sampler, fl.ShardedBatchSampler)
        assert (loader.batch_sampler.rank, loader.batch_sampler.world_size, len(loader.batch_sampler)) == (1, 2, 1)
        # DataLoader's sampler counts this rank's samples: 10 over 2 ranks, drop_last drops none of them
        assert (loader.sampler.rank, loader.sampler.num_replicas, len(loader.sampler)) == (1, 2, 5)
        assert not isinstance(loader.dataset, torch.utils.data.IterableDataset)


def test_sampler_set_epoch_selects_the_next_pass_like_loader_set_epoch():
    """Lightning calls loader.sampler.set_epoch(epoch) before each epoch (also when resuming)."""
    def labels(loader, epoch=None):
        if epoch is not None:
            loader.set_epoch(epoch)
        return [y.tolist() for _, y in loader]

    opts = dict(batch_size=4, shuffle=True, num_workers=0, device="cpu", seed=0)
    with fl.Loader(Squares(12), **opts) as a, fl.Loader(Squares(12), **opts) as b:
        a.sampler.set_epoch(3)
        assert labels(a) == labels(b, 3) and a.epoch == 3
        a.sampler.set_epoch(7)
        assert labels(a) == labels(b, 7) and a.epoch == 7
        assert labels(a) == labels(b, 8) and a.epoch == 8, "without set_epoch a pass is the next epoch"
        a.set_epoch(2)  # the loader's own set_epoch, called last, wins
        assert labels(a) == labels(b, 2)


def test_rank_read_when_distributed_starts_after_construction(monkeypatch):
    loader = fl.Loader(Squares(10), batch_size=2, num_workers=0, device="cpu", shuffle=True, seed=0)
    assert (loader.rank, loader.world_size, len(loader)) == (0, 1, 5)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    assert len(loader) == 3 and (loader.rank, loader.world_size) == (1, 2)
    seen = [i for _, y in loader for i in y.tolist()]
    loader.close()
    want = np.random.default_rng((0, 0)).permutation(10)[1::2]
    assert seen == want.tolist()


refs.stub_meta_registrations()  # Lightning imports torchmetrics, which imports torchvision (test-only, no ops)
pl = pytest.importorskip("lightning.pytorch", reason="the Lightning tests need lightning (the dev extra)")


def _fit(tmp_path, devices, workers, n=40):
    out = tmp_path / "seen"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "lightning_worker.py"), str(out), str(n), str(devices),
                           str(workers)], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((tmp_path / f"seen.{r}").read_text()) for r in range(devices)]


@pytest.mark.slow  # Lightning's import and Trainer: about 10 s
def test_lightning_trainer_fits_one_epoch_on_a_loader(tmp_path):
    (rank0,) = _fit(tmp_path, devices=1, workers=2)
    assert sorted(rank0["seen"]) == list(range(40))


@pytest.mark.slow  # two Lightning processes: about 9 s
def test_lightning_ddp_two_cpu_processes_see_every_sample_once(tmp_path):
    ranks = _fit(tmp_path, devices=2, workers=0)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) == 20
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == list(range(40)), "every sample exactly once"
