"""A stream's worker processes persist across passes, as an indexed source's do (unless
``persistent_workers=False``): each pass is posted to them (``sources/board.py``), a pass
given up ends at their next batch, and a dead worker is replaced for the next pass."""

import io
import os
import signal
import tarfile

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, make_image

import fastload as fl


class Logged:
    """Crops to 16x16 and appends ``pid`` to ``path`` for each image (O_APPEND: whole lines
    from every worker)."""

    def __init__(self, path):
        self.path = path

    def __call__(self, img):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return np.ascontiguousarray(img[:16, :16])


def _shards(folder, shards=4, per_shard=16):
    for s in range(shards):
        with tarfile.open(os.path.join(folder, f"shard-{s:06d}.tar"), "w") as t:
            for k in range(s * per_shard, (s + 1) * per_shard):
                for name, value in ((f"s{k:05d}.jpg", jpeg_bytes(make_image(k, 24, 24))), (f"s{k:05d}.cls", b"%d" % k)):
                    info = tarfile.TarInfo(name)
                    info.size = len(value)
                    t.addfile(info, io.BytesIO(value))
    return shards * per_shard


def _calls(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f.read().split()]


def _loader(tmp_path, log, **kw):
    data = os.path.join(tmp_path, "data")
    os.makedirs(data, exist_ok=True)
    n = _shards(data)
    ds = fl.WebDataset(data, transform=Logged(log))
    opts = dict(batch_size=4, num_workers=2, device="cpu", seed=3, shuffle=True, return_index=True, normalize=False)
    return fl.Loader(ds, **{**opts, **kw}), n


@pytest.mark.parametrize("persistent", [True, False])
def test_a_streams_workers_persist_across_epochs_unless_told_not_to(tmp_path, persistent):
    log = os.path.join(tmp_path, "calls")
    loader, n = _loader(tmp_path, log, persistent_workers=persistent)
    pids = []
    with loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            before = len(_calls(log))
            assert sorted(k for _, _, index in loader for k in index.tolist()) == list(range(n))
            pids.append(set(_calls(log)[before:]))
    assert all(len(p) == 2 for p in pids), pids
    if persistent:
        assert pids[0] == pids[1] == pids[2]
    else:
        assert not (pids[0] & pids[1]) and not (pids[1] & pids[2])


def test_persistent_workers_read_each_epoch_as_new_workers_would(tmp_path):
    """The same batches, pixels and order, epoch after epoch (shuffled by the epoch's seed), as
    workers started for each pass: a persistent worker reads the pass it is told, not its first."""
    got = {}
    for persistent in (True, False):
        loader, _ = _loader(tmp_path, os.path.join(tmp_path, f"log{persistent}"), persistent_workers=persistent)
        with loader:
            got[persistent] = []
            for epoch in range(3):
                loader.set_epoch(epoch)
                got[persistent].append([(x.clone(), y.clone(), i.clone()) for x, y, i in loader])
    for a, b in zip(got[True], got[False]):
        assert len(a) == len(b)
        for (xa, ya, ia), (xb, yb, ib) in zip(a, b):
            assert torch.equal(ia, ib) and torch.equal(ya, yb) and torch.equal(xa, xb)
    orders = [torch.cat([i for _, _, i in epoch]).tolist() for epoch in got[True]]
    assert orders[0] != orders[1] != orders[2]  # each epoch its own order


def test_a_pass_given_up_ends_at_the_workers_next_batch_not_at_its_end(tmp_path):
    """Breaking out of an epoch, then the next epoch: the workers stop reading the pass given up
    (at most the batches under way and prefetched are made), they do not read it to its end."""
    log = os.path.join(tmp_path, "calls")
    loader, n = _loader(tmp_path, log, prefetch_factor=2)
    with loader:
        it = iter(loader)
        next(it)
        del it
        loader.set_epoch(1)
        before = len(_calls(log))
        assert sorted(k for _, _, index in loader for k in index.tolist()) == list(range(n))
        given_up = before + (len(_calls(log)) - before - n)  # decoded in the pass given up
    # One batch taken; per worker: its prefetched batches, the one under way, and one more
    # made while the drain asked for the next: (2 + 2) x 4 records each.
    assert given_up <= 4 + 2 * 4 * 4 < n, given_up


def test_a_dead_persistent_stream_worker_is_named_and_replaced_for_the_next_epoch(tmp_path):
    log = os.path.join(tmp_path, "calls")
    loader, n = _loader(tmp_path, log)
    with loader:
        sum(1 for _ in loader)  # epoch 0: the workers start
        first = set(_calls(log))
        loader.set_epoch(1)
        it = iter(loader)
        next(it)
        os.kill(sorted(first)[0], signal.SIGKILL)
        with pytest.raises(fl.WorkerFailure, match="worker"):
            for _ in it:
                pass
        del it
        loader.set_epoch(2)
        before = len(_calls(log))
        assert sorted(k for _, _, index in loader for k in index.tolist()) == list(range(n))
        now = set(_calls(log)[before:])
    assert len(now) == 2 and sorted(first)[0] not in now
