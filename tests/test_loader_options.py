"""The Loader's options: DataLoader's keywords and twelve of fastload's own, grouped where
they belong (normalize=fl.Normalize, shard=fl.Shard); the old spellings keep working with a
DeprecationWarning that shows the new form, in scripts, saved configs and tuned profiles."""

import dataclasses
import inspect
import json
import math
import multiprocessing
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import fastload as fl
from fastload.loading import compat

OWN = {"config", "batch_transform", "seed", "device", "backend", "decode", "gpu_cpu_share", "normalize", "shard", "on_error",
       "stall_warning", "return_index"}


class Pixels:
    def __init__(self, n=24):
        self.n = n

    def __len__(self):
        return self.n

    def load(self, index, epoch=0, seed=0):
        rng = np.random.default_rng([index, epoch, seed])
        return rng.integers(0, 256, (10, 8, 3), dtype=np.uint8), index % 5


def loader_options() -> set[str]:
    """Every keyword the Loader takes, as a user sees them."""
    signature = {p for p in inspect.signature(fl.Loader).parameters if p not in ("dataset", "args", "options")}
    return signature | {f.name for f in dataclasses.fields(fl.LoaderConfig)} | set(compat.KEYWORDS)


def test_dataloaders_keywords_and_twelve_of_its_own():
    dataloader = set(inspect.signature(DataLoader).parameters) - {"dataset", "self"}
    options = loader_options()
    assert dataloader <= options, sorted(dataloader - options)
    assert options - dataloader == OWN


def _batches(**options):
    opts = dict(batch_size=5, num_workers=0, shuffle=True, seed=1, device="cpu", stall_warning=0, return_index=True)
    with fl.Loader(Pixels(), **{**opts, **options}) as loader:
        return loader.config, [tuple(t.clone() for t in b) for b in loader]


OLD = dict(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), dtype=torch.bfloat16, rank=1, world_size=2, drop_uneven=True,
           shuffle_seed=7, start_method="spawn")
NEW = dict(normalize=fl.Normalize(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), dtype="bfloat16"),
           shard=fl.Shard(rank=1, world_size=2, drop_uneven=True, shuffle_seed=7), multiprocessing_context="spawn")


def test_old_spellings_give_the_same_loader_with_a_warning_showing_the_new_form():
    with pytest.warns(DeprecationWarning) as caught:
        old_config, old = _batches(**OLD)
    messages = "\n".join(str(w.message) for w in caught if w.category is DeprecationWarning)
    assert "write normalize=fl.Normalize(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), dtype=torch.bfloat16)" in messages
    assert "write shard=fl.Shard(rank=1, world_size=2, drop_uneven=True, shuffle_seed=7)" in messages
    assert "write multiprocessing_context='spawn'" in messages
    assert all(w.filename == __file__ for w in caught), "the warnings point at the caller's line"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new_config, new = _batches(**NEW)
    assert old_config == new_config
    assert len(old) == len(new) == 3  # rank 1 of 2, 12 samples
    for a, b in zip(old, new, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert old[0][0].dtype == torch.bfloat16


def test_old_spellings_add_to_the_given_config_and_group():
    base = fl.LoaderConfig(normalize=fl.Normalize(dtype="float16"), shard=fl.Shard(world_size=4))
    with (pytest.warns(DeprecationWarning, match=r"fl.Loader\(mean=...\) is deprecated"),
          pytest.warns(DeprecationWarning, match=r"fl.Loader\(rank=...\) is deprecated")):
        loader = fl.Loader(Pixels(), base, mean=(0.1, 0.2, 0.3), rank=3, num_workers=0, device="cpu")
    with loader:
        assert loader.config.normalize == fl.Normalize(mean=(0.1, 0.2, 0.3), dtype="float16")
        assert loader.config.shard == fl.Shard(rank=3, world_size=4) and loader.rank == 3
    with pytest.warns(DeprecationWarning, match=r"LoaderConfig.replace\(std=...\)"):
        assert base.replace(std=(0.5, 0.5, 0.5)).normalize.std == (0.5, 0.5, 0.5)
    with pytest.warns(DeprecationWarning, match="ignored with normalize=False"):
        assert fl.LoaderConfig(normalize=False, mean=(0.5, 0.5, 0.5)).normalize is False


def test_old_attributes_read_with_a_warning():
    cfg = fl.LoaderConfig(normalize=fl.Normalize(std=(0.5, 0.5, 0.5)), shard=fl.Shard(rank=0),
                          multiprocessing_context=multiprocessing.get_context("forkserver"))
    expected = {"std": (0.5, 0.5, 0.5), "mean": fl.Normalize().mean, "dtype": "float32", "rank": 0,
                "world_size": None, "drop_uneven": False, "shuffle_seed": None, "start_method": "forkserver"}
    for name, value in expected.items():
        with pytest.warns(DeprecationWarning, match=f"LoaderConfig.{name} is deprecated"):
            assert getattr(cfg, name) == value
    with pytest.raises(AttributeError, match="no attribute 'colour'"):
        cfg.colour


def test_a_config_saved_by_the_old_tuner_loads():
    """``report["config"]`` as fastload tune wrote it before the options were grouped."""
    saved = {"batch_size": 128, "shuffle": True, "drop_last": False, "drop_uneven": False, "num_workers": 4,
             "prefetch_factor": 2, "persistent_workers": True, "pin_memory": None, "backend": "thread",
             "start_method": None, "seed": None, "shuffle_seed": None, "device": "cpu", "normalize": True,
             "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "dtype": "float32", "on_error": "raise",
             "timeout": 0.0, "stall_warning": 60.0, "rank": None, "world_size": None, "return_index": False,
             "decode": "cpu"}
    with pytest.warns(DeprecationWarning):
        cfg = fl.LoaderConfig(**saved)
    assert cfg == fl.LoaderConfig(batch_size=128, shuffle=True, num_workers=4, backend="thread", device="cpu")
    assert fl.LoaderConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg, "and the new form round-trips"


def test_a_profile_saved_by_the_old_tuner_is_used(tmp_path, monkeypatch):
    from fastload.loading import profiles

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    ds = Pixels()
    old_config = {"batch_size": 64, "num_workers": 3, "backend": "thread", "prefetch_factor": 4, "mean": [0.5] * 3,
                  "std": [0.2] * 3, "dtype": "float16", "start_method": "spawn", "rank": None, "world_size": None,
                  "drop_uneven": False, "shuffle_seed": None, "normalize": True}
    profiles.save(ds, old_config, {"samples_per_s": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # only the tuned settings are read from it
        with fl.Loader(ds, device="cpu") as loader:
            assert (loader.num_workers, loader.config.backend, loader.config.prefetch_factor) == (3, "thread", 4)
            assert loader.config.normalize == fl.Normalize()


@pytest.mark.parametrize("options, error, says", [
    (dict(normalize="yes"), ValueError, r"normalize must be True, False or fl.Normalize\(mean=..., std=..., dtype=...\)"),
    (dict(normalize=fl.Normalize), ValueError, r"normalize=fl.Normalize is the class: call it, fl.Normalize\(\)"),
    (dict(shard=fl.Shard), ValueError, r"shard=fl.Shard is the class: call it, fl.Shard\(rank=..., world_size=...\)"),
    (dict(shard=(0, 2)), ValueError, r"shard must be fl.Shard\(rank=..., world_size=..."),
    (dict(shard={"rank": 2, "world_size": 2}), ValueError, r"rank 2 must be in \[0, 2\)"),
    (dict(multiprocessing_context=object()), TypeError, "give a start method name"),
    (dict(multiprocessing_context="threads"), ValueError, "multiprocessing_context='threads'"),
])
def test_bad_values_are_named(options, error, says):
    with pytest.raises(error, match=says):
        fl.Loader(Pixels(), num_workers=0, device="cpu", **options)


@pytest.mark.parametrize("options, error, says", [
    (dict(seed=2**64), ValueError, r"seed must be < 2\*\*64 .*got 18446744073709551616"),
    (dict(device=5), ValueError, r"device=5 \(cuda:5\) requested but CUDA is not available"),
    (dict(device="tpu"), ValueError, r"device='tpu' names no device"),
    (dict(device=1.5), TypeError, r"device must be a device name .*got float 1.5"),
    (dict(timeout=10**30), ValueError, r"timeout must be a number of seconds >= 0, got 10{30}: more than"),
    (dict(timeout=math.inf), ValueError, r"timeout must be a number of seconds >= 0, got inf"),
    (dict(timeout=math.nan), ValueError, r"timeout must be a number of seconds >= 0, got nan"),
    (dict(stall_warning=math.nan), ValueError, r"stall_warning must be a number of seconds >= 0, got nan"),
    (dict(stall_warning=10**400), ValueError, r"stall_warning must be a number of seconds >= 0, got 10{400}"),
])
def test_values_that_escaped_the_checks_are_named_at_construction(options, error, says):
    # Issue 40 (trust round 5): each was torch's error, an OverflowError at iteration, or accepted.
    if "device" in options and torch.cuda.is_available() and isinstance(options["device"], int):
        pytest.skip("a CUDA index is a device where CUDA is available")
    with pytest.raises(error, match=says):
        fl.Loader(Pixels(), num_workers=0, **{"device": "cpu", **options})
    assert fl.LoaderConfig(seed=2**64 - 1, timeout=3.5, stall_warning=0).seed == 2**64 - 1


@pytest.mark.parametrize("make, says", [
    (lambda: fl.Normalize(mean=(123.7, 116.3, 103.5)), r"divide by 255: \(0.4851"),
    (lambda: fl.Normalize(std=(0.2, 0.0, 0.2)), "std values must be positive"),
    (lambda: fl.Normalize(dtype="float64"), "dtype must be one of"),
    (lambda: fl.Shard(rank=-1), "rank must be None or an int >= 0"),
    (lambda: fl.Shard(world_size=0), "world_size must be None or an int >= 1"),
    (lambda: fl.Shard(drop_uneven="yes"), "drop_uneven must be True or False"),
])
def test_groups_check_their_values_when_made(make, says):
    with pytest.raises(ValueError, match=says):
        make()


def test_a_distributed_sampler_sets_the_shard_and_disagreements_are_named():
    ds = Pixels()
    sampler = DistributedSampler(ds, num_replicas=3, rank=2, shuffle=False, seed=4, drop_last=True)
    with fl.Loader(ds, sampler=sampler, num_workers=0, device="cpu") as loader:
        assert loader.config.shard == fl.Shard(rank=2, world_size=3, drop_uneven=True, shuffle_seed=4)
    with pytest.raises(ValueError, match="shard's rank=0 disagrees with the DistributedSampler's 2"):
        fl.Loader(ds, sampler=sampler, shard=fl.Shard(rank=0), num_workers=0, device="cpu")
    with fl.Loader(ds, sampler=None, num_workers=0, device="cpu") as whole:  # DataLoader's meaning
        assert whole.config.shard == fl.Shard(rank=0, world_size=1)
