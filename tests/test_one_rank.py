"""One rank (no DDP): every sample of an epoch exactly once, and len(loader) the number of
batches that come, as DataLoader does: for any worker count, backend and drop_last, and a
dataset size that no batch size or worker count divides (209). Streams (WebDataset,
TFRecordStream) too: their workers read runs of whole batches, unpadded, and resume exactly,
also from or onto other ranks (issue 28 item 9)."""

import collections
import math

import numpy as np
import pytest
import torch

import fastload as fl

N, BATCH = 209, 16


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.full((4, 4, 3), i % 251, np.uint8), i


CASES = [("process", 0)] + [(backend, w) for backend in ("process", "thread") for w in (1, 2, 3)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("backend,workers", CASES)
def test_every_sample_once_and_len_is_the_batches_that_come(backend, workers, drop_last):
    with fl.Loader(Numbers(), batch_size=BATCH, num_workers=workers, backend=backend, device="cpu",
                   drop_last=drop_last, shuffle=True, normalize=False) as loader:
        for _ in range(2):  # two epochs: a persistent worker's second pass too
            sizes, seen = [], collections.Counter()
            for _, y in loader:
                sizes.append(len(y))
                seen.update(y.tolist())
            expected = N // BATCH * BATCH if drop_last else N
            assert sum(sizes) == expected and max(seen.values()) == 1, (sizes, seen.most_common(2))
            assert len(loader) == len(sizes) == (N // BATCH if drop_last else math.ceil(N / BATCH))


def _stream(kind, tmp_path, monkeypatch):
    """209 records over three files/shards, record n labelled n."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if kind == "webdataset":
        from wds_servers import write_shards

        write_shards(tmp_path / "data", [70, 70, 69])
        return fl.WebDataset(str(tmp_path / "data"), fl.transforms.eval(16, resize=20))
    from conftest import need_formats
    from tfrecord_files import write_shards

    need_formats("tfrecord")
    root = write_shards(tmp_path / "data", [70, 70, 69], gz=kind == "tfrecord.gz")
    return fl.TFRecordStream(root + "/part-*", fl.transforms.eval(16, resize=20))


def _labels(loader, k=None):
    out = []
    for _, y in loader:
        out.append(y.tolist())
        if len(out) == k:
            break
    return out


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("kind", ["webdataset", "tfrecord", "tfrecord.gz"])
def test_a_stream_on_one_rank_gives_every_record_once(tmp_path, monkeypatch, kind, workers, drop_last):
    ds = _stream(kind, tmp_path, monkeypatch)
    with fl.Loader(ds, batch_size=BATCH, num_workers=workers, device="cpu", drop_last=drop_last,
                   shuffle=kind == "webdataset", normalize=False) as loader:
        sizes, seen = [], collections.Counter()
        for _, y in loader:
            sizes.append(len(y))
            seen.update(y.tolist())
    assert sum(sizes) == (N // BATCH * BATCH if drop_last else N) and max(seen.values()) == 1
    assert len(loader) == len(sizes) == (N // BATCH if drop_last else math.ceil(N / BATCH))
    assert sizes[:-1] == [BATCH] * (len(sizes) - 1), sizes  # only the epoch's last batch is short


@pytest.mark.parametrize("kind", ["webdataset", "tfrecord"])
@pytest.mark.parametrize("stop", [1, 5, 13])  # 13 of 14: the three workers stand at different batches
def test_a_stream_on_one_rank_resumes_exactly(tmp_path, monkeypatch, kind, stop):
    ds = _stream(kind, tmp_path, monkeypatch)
    opts = dict(batch_size=BATCH, num_workers=3, device="cpu", normalize=False, shuffle=kind == "webdataset", seed=3)
    with fl.Loader(ds, **opts) as ref:
        want = _labels(ref)
    with fl.Loader(ds, **opts) as a:
        head = _labels(a, stop)
        state = a.state_dict()
    with fl.Loader(ds, **opts) as b:
        b.load_state_dict(state)
        assert len(b) == len(want) - stop
        assert head + _labels(b) == want
    assert sorted(sum(want, [])) == list(range(N))


@pytest.mark.parametrize("old,new", [((1, 3), (2, 2)), ((2, 2), (1, 3)), ((1, 3), (1, 2))])
def test_a_stream_resumed_on_or_from_one_rank_finishes_the_epoch_once(tmp_path, monkeypatch, old, new):
    ds = _stream("webdataset", tmp_path, monkeypatch)
    opts = dict(batch_size=BATCH, device="cpu", normalize=False, shuffle=True, seed=3)
    taken, states = [], []
    for rank in range(old[0]):
        with fl.Loader(ds, num_workers=old[1], shard=fl.Shard(rank=rank, world_size=old[0]), **opts) as loader:
            taken += sum(_labels(loader, 4 + rank), [])  # ranks stop at different batches
            states.append(loader.state_dict())
    rest, counts = [], set()
    for rank in range(new[0]):
        with fl.Loader(ds, num_workers=new[1], shard=fl.Shard(rank=rank, world_size=new[0]), **opts) as loader:
            loader.load_state_dict(states)
            length = len(loader)
            batches = _labels(loader)
        assert length == len(batches), "len(loader) of a resumed pass is the batches that come"
        counts.add(len(batches))
        rest += sum(batches, [])
    assert len(counts) == 1
    assert not set(taken) & set(rest) and sorted(set(taken + rest)) == list(range(N))
    if new[0] == 1:  # one rank pads nothing: what was left, each once, in whole batches
        assert len(taken) + len(rest) == N and counts == {math.ceil((N - len(taken)) / BATCH)}
