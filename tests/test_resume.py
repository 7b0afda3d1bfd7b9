"""Checkpoint and resume: the plan (pure functions), the Loader's state, new processes, torchrun."""

import collections
import itertools
import json
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.datasets import sample_rng
from fastload.datasets.protocols import LoadTraits
from fastload.sources.resume import Stage, compact, remaining, resumed_indices
from fastload.sources.sampler import ShardedBatchSampler, epoch_order

import resume_worker
from conftest import need_formats, write_folder
from torchrun import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
OPTS = dict(batch_size=5, shuffle=True, seed=5, normalize=False, device="cpu")  # as in resume_worker.py


# ---- the plan, without a Loader

def _consumed(n, world, consumed, batch_size, drop_last, seed=1, epoch=2):
    """What ranks consumed of an epoch, read from the sampler itself (not from fastload.sources.resume)."""
    return [i for rank, c in enumerate(consumed) for i in
            ShardedBatchSampler(n, batch_size, shuffle=True, seed=seed, rank=rank, world_size=world,
                                drop_last=drop_last).rank_indices(epoch)[: c * batch_size].tolist()]


def _resumed(n, stages, world, batch_size, drop_last, seed=1, epoch=2):
    order = epoch_order(n, seed, epoch, True)
    return [resumed_indices(order, stages, r, world, batch_size, drop_last) for r in range(world)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n,world", [(24, 1), (23, 2), (31, 3), (7, 2)])
def test_same_world_size_goes_on_with_each_ranks_own_batches(n, world, drop_last):
    batch = 3
    sampler = [ShardedBatchSampler(n, batch, shuffle=True, seed=1, rank=r, world_size=world, drop_last=drop_last)
               for r in range(world)]
    for c in range(len(sampler[0]) + 1):
        got = _resumed(n, [Stage(world, (c,) * world)], world, batch, drop_last)
        for r in range(world):
            assert got[r].tolist() == sampler[r].rank_indices(2)[c * batch:].tolist(), (c, r)


@pytest.mark.parametrize("old,new,consumed", [(2, 1, (3, 3)), (1, 4, (5,)), (2, 3, (3, 3)), (3, 2, (2, 2, 2)),
                                              (2, 3, (1, 4)), (4, 4, (0, 1, 2, 3))])
def test_elastic_resume_consumes_every_sample_once(old, new, consumed):
    n, batch = 60, 4
    before = _consumed(n, old, consumed, batch, False)
    after = _resumed(n, [Stage(old, consumed)], new, batch, False)
    assert len({len(r) for r in after}) == 1, "every new rank gets as many samples"
    seen = before + [i for r in after for i in r.tolist()]
    assert set(seen) == set(range(n))
    pads = len(seen) - n  # the new layout pads by repeating the epoch's head, as DistributedSampler does
    assert 0 <= pads < new and np.bincount(seen).max() <= 2
    if (n - len(before)) % new == 0:
        assert sorted(seen) == list(range(n)), "nothing to pad: each sample exactly once"


@pytest.mark.parametrize("new", [1, 3])
def test_elastic_resume_with_drop_last_never_repeats(new):
    n, batch = 61, 4  # on 2 ranks, 7 batches each: the last 5 samples of the epoch are dropped
    before = _consumed(n, 2, (2, 3), batch, True)
    after = _resumed(n, [Stage(2, (2, 3))], new, batch, True)
    seen = before + [i for r in after for i in r.tolist()]
    assert len(seen) == len(set(seen)) and all(len(r) % batch == 0 and len(r) == len(after[0]) for r in after)
    visited = epoch_order(n, 1, 2, True)[: 2 * 7 * batch]
    assert set(seen) <= set(visited.tolist()), "what the interrupted epoch dropped stays dropped"
    assert len(visited) - len(seen) < new * batch, "only what drop_last drops on the new ranks is left out"


@pytest.mark.parametrize("n,first,second", [(7, Stage(2, (0, 2)), None),
                                            (60, Stage(2, (0, 3)), Stage(5, (0, 0, 0, 3, 3)))])
def test_a_consumed_padding_repeat_consumes_its_sample(n, first, second):
    """A rank that finished its padded last batch saw the epoch's first sample(s) again; the
    rank holding the original had not reached it: it is consumed, not dealt out once more."""
    batch = 2 if n == 7 else 4
    seen = _consumed(n, first.world_size, first.consumed, batch, False)
    stages = [first]
    if second is not None:
        middle = _resumed(n, stages, second.world_size, batch, False)
        seen += [i for r, c in enumerate(second.consumed) for i in middle[r][: c * batch].tolist()]
        stages.append(second)
    rest = _resumed(n, stages, 1, batch, False)[0].tolist()
    assert not set(rest) & set(seen), "nothing consumed (also as a padding repeat) is dealt out again"
    assert sorted(set(seen) | set(rest)) == list(range(n))


def test_an_epoch_interrupted_twice_on_three_world_sizes():
    n, batch = 60, 4
    first = Stage(2, (3, 3))
    middle = _resumed(n, [first], 3, batch, False)  # 12 samples per rank
    second = Stage(3, (1, 2, 0))
    last = _resumed(n, [first, second], 1, batch, False)[0]
    seen = _consumed(n, 2, first.consumed, batch, False)
    seen += [i for r, c in enumerate(second.consumed) for i in middle[r][: c * batch].tolist()]
    seen += last.tolist()
    assert sorted(seen) == list(range(n))


def test_compact_folds_what_each_rank_went_on_with():
    assert compact([Stage(2, (0, 0)), Stage(2, (3, 3)), Stage(2, (1, 2))]) == (Stage(2, (4, 5)),)
    assert compact([Stage(2, (3, 4)), Stage(2, (1, 1))]) == (Stage(2, (3, 4)), Stage(2, (1, 1)))
    assert compact([Stage(2, (3, 3)), Stage(3, (1, 1, 1))]) == (Stage(2, (3, 3)), Stage(3, (1, 1, 1)))
    order = epoch_order(50, 0, 0, True)
    for drop_last in (False, True):
        for stages in ([Stage(2, (3, 3)), Stage(2, (1, 2))], [Stage(3, (2, 2, 2)), Stage(3, (0, 1, 1))]):
            assert remaining(order, compact(stages), 4, drop_last).tolist() == \
                remaining(order, stages, 4, drop_last).tolist()


def test_more_batches_than_the_epoch_has_is_an_error():
    with pytest.raises(ValueError, match="rank 1 of 2 consumed 9 batches, but that part of the epoch has 8"):
        remaining(np.arange(60), [Stage(2, (8, 9))], 4, False)


# ---- the Loader's state

@pytest.fixture(scope="module")
def ds(folder):
    return fl.ImageFolder(folder, transform=fl.transforms.train(24))


def _take(loader, k):
    it = iter(loader)
    return [(x.clone(), y.clone()) for _, (x, y) in zip(range(k), it)]


def _reference(ds, epoch=0, **kw):
    with fl.Loader(ds, num_workers=0, **{**OPTS, **kw}) as ref:
        ref.set_epoch(epoch)
        return [(x.clone(), y.clone()) for x, y in ref]


def _same(got, want):
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gy, wy) and torch.equal(gx, wx)


def _plain(value):
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(map(_plain, value))
    return type(value) in (int, bool, str)


def test_state_dict_follows_the_passes(ds, tmp_path):
    with fl.Loader(ds, num_workers=0, **OPTS) as loader:
        assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (0, 0)
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        assert (state["epoch"], state["consumed"], state["world_size"], state["rank"]) == (0, 2, 1, 0)
        assert _plain(state)
        torch.save(state, tmp_path / "s.pt")
        assert torch.load(tmp_path / "s.pt", weights_only=True) == state
        list(it)
        assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (1, 0), "a finished pass"
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (1, 3), "an interrupted pass"
        loader.set_epoch(7)
        assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (7, 0)


def test_batches_the_device_stage_holds_are_not_consumed(ds, monkeypatch):
    """As the CUDA side stream does, the device stage here takes 3 batches before handing out one."""
    with fl.Loader(ds, num_workers=0, **OPTS) as loader:
        run = loader._driver.run

        def ahead(batches, finish=None):
            outputs = run(batches, finish)
            held = collections.deque(itertools.islice(outputs, 3))
            while held:
                yield held.popleft()
                held.extend(itertools.islice(outputs, 1))

        monkeypatch.setattr(loader._driver, "run", ahead)
        head = _take(loader, 2)
        state = loader.state_dict()
    assert state["consumed"] == 2
    with fl.Loader(ds, num_workers=0, **OPTS) as again:
        again.load_state_dict(state)
        _same(head + [(x.clone(), y.clone()) for x, y in again], _reference(ds))


def test_resuming_twice_in_one_epoch(ds):
    """A state saved in a resumed epoch resumes too, and on the same world size stays plain."""
    want = _reference(ds)
    with fl.Loader(ds, num_workers=0, **OPTS) as a:
        got = _take(a, 1)
        state = a.state_dict()
    with fl.Loader(ds, num_workers=0, **OPTS) as b:
        b.load_state_dict(state)
        assert b.state_dict() == state, "loaded, not yet iterated: the same position"
        got += _take(b, 2)
        state = b.state_dict()
    assert (state["consumed"], state["history"]) == (3, [])
    with fl.Loader(ds, backend="thread", num_workers=2, **OPTS) as c:
        c.load_state_dict(state)
        got += [(x.clone(), y.clone()) for x, y in c]
    _same(got, want)


class _Recording(fl.ImageDataset):
    load_traits = LoadTraits(takes_out=True)  # its load passes the batch row on

    def __init__(self, inner):
        super().__init__(inner.labels)
        self.inner, self.loaded, self.lock = inner, [], threading.Lock()

    def load(self, index, epoch=0, seed=0, out=None):
        with self.lock:
            self.loaded.append(index)
        return self.inner.load(index, epoch, seed, out=out)

    def describe(self, index):
        return self.inner.describe(index)


def test_consumed_batches_are_not_loaded_again(ds):
    with fl.Loader(ds, num_workers=0, **OPTS) as a:
        consumed = [i for _, y in _take(a, 3) for i in y.tolist()]  # labels: enough to tell batches apart
        state = a.state_dict()
        order = a.batch_sampler.rank_indices(0)
    recording = _Recording(ds)
    with fl.Loader(recording, backend="thread", num_workers=2, **OPTS) as b:
        b.load_state_dict(state)
        rest = [y for _, y in b]
    assert sorted(recording.loaded) == sorted(order[15:].tolist()), "exactly the rest of the epoch is read"
    assert len(consumed) + sum(map(len, rest)) == len(ds)


@pytest.mark.parametrize("kind", ["list", "lmdb", "tfrecord"])
def test_every_map_style_format_resumes(ds, folder, tmp_path, kind):
    from fastload.convert import convert

    need_formats(*(() if kind == "list" else (kind,)))

    if kind == "list":
        other = fl.ImageList.from_arrays(ds.paths, ds.labels, root=folder, transform=fl.transforms.train(24))
    else:
        convert(folder, str(tmp_path / kind), kind, workers=1, progress=False)
        other = fl.open_dataset(str(tmp_path / kind), transform=fl.transforms.train(24))
    with fl.Loader(other, num_workers=2, **OPTS) as a:
        head = _take(a, 2)
        state = a.state_dict()
    with fl.Loader(other, backend="thread", num_workers=2, **OPTS) as b:
        b.load_state_dict(state)
        _same(head + [(x.clone(), y.clone()) for x, y in b], _reference(other))


def test_bad_states_are_rejected(ds, folder, tmp_path):
    with fl.Loader(ds, num_workers=0, **OPTS) as loader:
        _take(loader, 2)
        good = loader.state_dict()

    def load(state, dataset=ds, **kw):
        with fl.Loader(dataset, num_workers=0, **{**OPTS, **kw}) as fresh:
            fresh.load_state_dict(state)

    smaller = fl.ImageFolder(write_folder(tmp_path / "small", per_class=7), transform=fl.transforms.train(24))
    with pytest.raises(ValueError, match="dataset of 24 samples; this one has 21"):
        load(good, smaller)
    with pytest.raises(ValueError, match="another dataset of 24 samples"):
        load(good, fl.ImageList.from_arrays([f"x{i}.jpg" for i in range(24)], np.zeros(24, np.int64)))
    renamed = write_folder(tmp_path / "renamed", per_class=8)
    os.rename(os.path.join(renamed, "c2", "007.jpg"), os.path.join(renamed, "c2", "008.jpg"))
    with pytest.raises(ValueError, match="another dataset"):
        load(good, fl.ImageFolder(renamed, transform=fl.transforms.train(24)))
    load(good, fl.ImageFolder(write_folder(tmp_path / "moved"), transform=fl.transforms.train(24)))  # moved: fine
    for option, value in [("seed", 6), ("batch_size", 4), ("shuffle", False), ("drop_last", True)]:
        with pytest.raises(ValueError, match=f"{option}="):
            load(good, **{option: value})
    with pytest.raises(ValueError, match="version"):
        load({**good, "version": 99})
    with pytest.raises(ValueError, match="consumed 6 batches, but that part of the epoch has 5"):
        load({**good, "consumed": 6})
    with pytest.raises(ValueError, match="consumed must be an int"):
        load({**good, "consumed": -1})
    with pytest.raises(TypeError, match="dict"):
        load("state.pt")


class _Numbers(fl.ImageDataset):
    """Sample i: a 2x2 image of value i % 256, label i."""

    def __init__(self, n):
        super().__init__(np.arange(n, dtype=np.int64))

    def load(self, index, epoch=0, seed=0):
        return np.full((2, 2, 3), index % 256, np.uint8), index


def test_merge_states():
    numbers, opts = _Numbers(40), dict(batch_size=4, shuffle=True, num_workers=0, device="cpu")
    shards = [fl.Shard(rank=r, world_size=2) for r in range(2)]
    with fl.Loader(numbers, shard=shards[0], **opts) as r0, fl.Loader(numbers, shard=shards[1], **opts) as r1:
        _take(r0, 2), _take(r1, 3)
        states = [r0.state_dict(), r1.state_dict()]
    merged = fl.merge_states(states[::-1])
    assert merged["consumed"] == [2, 3] and "rank" not in merged and merged == fl.merge_states(states)
    with pytest.raises(ValueError, match=r"ranks \[1\] are missing"):
        fl.merge_states(states[:1])
    with pytest.raises(ValueError, match="given twice"):
        fl.merge_states([states[0], states[0]])
    with pytest.raises(ValueError, match=r"disagree on \['epoch'\]"):
        fl.merge_states([states[0], {**states[1], "epoch": 1}])
    with pytest.raises(ValueError, match="already merged"):
        fl.merge_states([merged])
    with fl.Loader(numbers, **opts) as single:
        with pytest.raises(ValueError, match="state of rank 0 of 2: pass the states of all ranks"):
            single.load_state_dict(states[0])
        single.load_state_dict(merged)
        seen = [i for _, y in single for i in y.tolist()]
    assert sorted(seen + _consumed(40, 2, (2, 3), 4, False, seed=0, epoch=0)) == list(range(40))


# ---- a new process

def test_resume_in_a_new_process_is_byte_identical(ds, folder, tmp_path):
    """Run to batch k, save, load in a new process (other backend, other worker count), finish:
    the concatenation is the uninterrupted epoch, byte for byte, and the next epoch is normal."""
    want, then = _reference(ds, 0), _reference(ds, 1)
    last = len(want)
    cases = {}
    for backend, resume_with in [("process", ("thread", 3)), ("thread", ("process", 1))]:
        for k in (0, 2, last - 1, last):  # 2: the workers have batches ready beyond the consumed ones
            with fl.Loader(ds, num_workers=2, backend=backend, prefetch_factor=2, **OPTS) as loader:
                head = _take(loader, k)
                state = loader.state_dict()
            case = str(tmp_path / f"{backend}{k}")
            torch.save(state, case + ".state.pt")
            with open(case + ".json", "w") as f:
                json.dump({"backend": resume_with[0], "workers": resume_with[1]}, f)
            cases[case] = head
    proc = subprocess.run([sys.executable, os.path.join(HERE, "resume_worker.py"), "finish", str(tmp_path), folder],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case, head in cases.items():
        rest = torch.load(case + ".rest.pt", weights_only=True)
        _same(head + rest["rest"], want)
        _same(rest["after"], then)


# ---- torchrun: 2 ranks save; 3 ranks (torchrun) and 1 rank resume

def _torchrun(ranks, *args):
    torchrun(os.path.join(HERE, "resume_worker.py"), *args, ranks=ranks, env=ENV)


def _read(out, name, ranks):
    return [json.loads((out / f"{name}.{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow  # torchrun twice: about 10 s
def test_elastic_resume_under_torchrun(tmp_path):
    n, k = 60, 3  # 2 ranks x 8 batches of 4 (the last of 2); 24 samples consumed, 36 left
    _torchrun(2, "save", tmp_path, n, k)
    before = [i for r in _read(tmp_path, "save2", 2) for i in r["seen"]]
    assert len(before) == 2 * k * 4
    for ranks in (1, 3):
        if ranks == 1:
            after = [resume_worker.resume(str(tmp_path), n, 0, 1)]  # here: a torchrun of one is no different
        else:
            _torchrun(ranks, "resume", tmp_path, n)
            after = _read(tmp_path, f"resume{ranks}", ranks)
        assert len({r["batches"] for r in after}) == 1 and after[0]["batches"] == -(-36 // ranks // 4)
        assert sorted(before + [i for r in after for i in r["seen"]]) == list(range(n)), "each sample once"
        nxt = [i for r in after for i in r["next"]]
        assert sorted(nxt) == list(range(n)) and {len(r["next"]) for r in after} == {n // ranks}
        want = [ShardedBatchSampler(n, 4, shuffle=True, seed=3, rank=r, world_size=ranks).rank_indices(1).tolist()
                for r in range(ranks)]
        assert [r["next"] for r in after] == want, "the next epoch is a normal one"


# ---- a stream, by record position in each slot

class ToyStream:
    """The interface StreamSource reads (records_for / slot_length / decode) over ``n`` records:
    contiguous slots, a short slot repeating its first records."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def _mine(self, slot, slots):
        return list(range(slot * self.n // slots, (slot + 1) * self.n // slots))

    def slot_length(self, num_slots, *, drop_last=False):
        sizes = [len(self._mine(s, num_slots)) for s in range(num_slots)]
        return min(sizes) if drop_last else max(sizes)

    def records_for(self, slot, num_slots, *, drop_last=False):
        length = self.slot_length(num_slots, drop_last=drop_last)
        numbers = (self._mine(slot, num_slots) * length)[:length]
        return (SimpleNamespace(number=i, where=f"record {i}", label=i, error=None) for i in numbers)

    def decode(self, record, epoch, seed):
        return sample_rng(seed, epoch, record.number).integers(0, 256, (4, 4, 3), dtype=np.uint8)


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_resumes_by_record_position(workers):
    stream = ToyStream(23)
    opts = dict(batch_size=3, num_workers=workers, normalize=False, device="cpu", seed=2)
    with fl.Loader(stream, **opts) as ref:
        want = [(x.clone(), y.clone()) for x, y in ref]
    for k in (0, 1, 3, len(want)):  # 3: the two slots stand at different record positions
        with fl.Loader(stream, **opts) as a:
            head = _take(a, k)
            state = a.state_dict()
        with fl.Loader(stream, **opts) as b:
            b.load_state_dict(state)
            _same(head + [(x.clone(), y.clone()) for x, y in b], want)
    with fl.Loader(stream, **{**opts, "num_workers": workers + 1}) as other:
        with pytest.raises(ValueError, match="same ranks and workers"):
            other.load_state_dict(state)
    with fl.Loader(stream, **opts) as same:
        with pytest.raises(ValueError, match="consumed, but the stream's epoch has"):
            same.load_state_dict({**state, "consumed": len(want) + 1})


class _Torchvisionish(torch.utils.data.Dataset):
    """A user's dataset named by torchvision's ``samples`` list of (path, label)."""

    def __init__(self, paths):
        self.samples = [(p, 0) for p in paths]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return np.full((8, 8, 3), i, np.uint8), 0


def test_a_wrapped_dataset_of_other_files_is_refused():
    a = _Torchvisionish([f"/data/a/{i}.jpg" for i in range(12)])
    b = _Torchvisionish([f"/data/b/x{i}.jpg" for i in range(12)])
    with fl.Loader(a, num_workers=0, **OPTS) as loader:
        _take(loader, 1)
        state = loader.state_dict()
    with fl.Loader(b, num_workers=0, **OPTS) as other, pytest.raises(ValueError, match="another dataset"):
        other.load_state_dict(state)
    with fl.Loader(_Torchvisionish([f"/moved/a/{i}.jpg" for i in range(12)]), num_workers=0, **OPTS) as moved:
        moved.load_state_dict(state)  # the same files elsewhere


def test_len_of_a_resumed_pass_is_what_is_left(ds):
    with fl.Loader(ds, num_workers=0, **OPTS) as loader:
        full = len(loader)
        _take(loader, 2)
        state = loader.state_dict()
    with fl.Loader(ds, num_workers=0, **OPTS) as again:
        again.load_state_dict(state)
        assert len(again) == full - 2
        assert len(list(again)) == full - 2
        assert len(again) == full


def test_set_epoch_after_a_resume_keeps_or_loudly_drops_it(ds):
    with fl.Loader(ds, num_workers=0, **OPTS) as loader:
        _take(loader, 2)
        state = loader.state_dict()
    with fl.Loader(ds, num_workers=0, **OPTS) as again:
        again.load_state_dict(state)
        again.sampler.set_epoch(0)  # what a DDP script does at the top of the resumed epoch
        assert len(list(again)) == 5 - 2, "sampler.set_epoch(0) keeps the resumed rest of epoch 0"
    with fl.Loader(ds, num_workers=0, **OPTS) as again:
        again.load_state_dict(state)
        with pytest.warns(RuntimeWarning, match=r"set_epoch\(3\) after load_state_dict of epoch 0"):
            again.set_epoch(3)
        _same([(x.clone(), y.clone()) for x, y in again], _reference(ds, 3))


def test_sampler_set_epoch_of_the_last_epoch_replays_it(ds):
    with fl.Loader(ds, num_workers=0, **OPTS) as loader:
        first = [(x.clone(), y.clone()) for x, y in loader]
        loader.sampler.set_epoch(0)  # the same epoch again
        _same([(x.clone(), y.clone()) for x, y in loader], first)
        assert loader.epoch == 0
