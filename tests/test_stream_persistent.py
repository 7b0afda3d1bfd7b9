"""A stream's worker processes persist across passes, as an indexed source's do (unless
``persistent_workers=False``): each pass is posted to them (``sources/board.py``), a pass
given up ends at their next batch, and a dead worker is replaced for the next pass."""

import io
import os
import signal
import tarfile
import threading
import time

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


def test_a_pass_stopped_before_a_worker_reads_it_is_seen_as_given_up():
    """A worker that reads the board only after the main process gave the pass up (a slow start:
    spawn, a fork server) sees the stop at its first batch: the pass carries the generation it
    was posted with, not the board's at the read."""
    from fastload.sources.board import PassBoard

    board = PassBoard()
    board.post({"epoch": 0})
    board.stop()
    generation, run = board.read()
    assert run == {"epoch": 0} and board.generation != generation
    board.post({"epoch": 1, "pad": "x" * 100_000})  # a pass larger than the segment was
    generation, run = board.read()
    assert run["epoch"] == 1 and board.generation == generation
    board.close()


def test_an_error_as_a_persistent_worker_begins_a_pass_reaches_the_consumer_as_itself(tmp_path, monkeypatch):
    """The stream refusing ``records_for`` at a later pass: the error, not a dead worker (torch
    resumes a persistent worker's pass with no guard around ``iter()``)."""
    records_for = fl.WebDataset.records_for

    def refusing(self, slot, num_slots, **kw):
        if kw.get("order") is not None and kw["order"].epoch == 1:
            raise ValueError("this order does not fit the dataset")
        return records_for(self, slot, num_slots, **kw)

    monkeypatch.setattr(fl.WebDataset, "records_for", refusing)  # the forked workers inherit it
    loader, n = _loader(tmp_path, os.path.join(tmp_path, "calls"))
    with loader:
        assert sum(len(i) for _, _, i in loader) == n
        loader.set_epoch(1)
        with pytest.raises(ValueError, match="does not fit"):
            sum(1 for _ in loader)
        loader.set_epoch(2)
        assert sorted(k for _, _, index in loader for k in index.tolist()) == list(range(n))


@pytest.mark.parametrize("taken", [1, 3])
def test_a_state_loaded_into_a_loader_whose_workers_run_finishes_the_epoch_once(tmp_path, taken):
    loader, n = _loader(tmp_path, os.path.join(tmp_path, "calls"))
    with loader:
        sum(1 for _ in loader)  # the workers run
        loader.set_epoch(1)
        it = iter(loader)
        first = sum((next(it)[2].tolist() for _ in range(taken)), [])
        state = loader.state_dict()
        del it
        loader.load_state_dict(state)
        rest = [k for _, _, index in loader for k in index.tolist()]
    assert sorted(first + rest) == list(range(n))


@pytest.mark.skipif(not __import__("fastload.decode.roi").decode.roi.available(), reason="needs nvImageCodec")
def test_gpu_decodes_cpu_share_reaches_persistent_workers_with_each_pass(tmp_path, monkeypatch):
    """decode="gpu" (run on the CPU here): the share of rows the workers decode on the CPU, read
    as each pass starts, is posted to workers that already run."""
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    n = _shards(tmp_path)
    ds = fl.WebDataset(str(tmp_path), transform=fl.transforms.train(16, reduced_decode=False))
    opts = dict(batch_size=4, num_workers=2, device="cpu", seed=3, return_index=True, normalize=False)
    seen = []
    with fl.Loader(ds, decode="gpu", gpu_cpu_share=0.0, **opts) as loader:
        for epoch, share in enumerate((0.0, 1.0, 0.0)):
            loader._source.cpu_share = lambda share=share: share  # as "auto" steers it between passes
            loader.set_epoch(epoch)
            before = loader.stats()["cpu_share_rows"]
            assert sum(len(i) for _, _, i in loader) == n
            seen.append(loader.stats()["cpu_share_rows"] - before)
    assert seen == [0, n, 0], seen


def test_a_close_from_another_thread_just_before_a_pass_is_posted_is_the_closed_error(tmp_path, monkeypatch):
    """close() lets go of the board: a pass about to post on it ends with the closed error, not
    with the OSError of a closed segment."""
    from fastload.sources.board import PassBoard

    loader, _ = _loader(tmp_path, os.path.join(tmp_path, "calls"))
    post = PassBoard.post

    def closed_first(board, run):
        loader.close()  # as if another thread closed the Loader at this moment
        post(board, run)

    with loader:
        sum(1 for _ in loader)
        monkeypatch.setattr(PassBoard, "post", closed_first)
        loader.set_epoch(1)
        with pytest.raises(RuntimeError, match=r"closed \(close\(\)\) during this pass"):
            sum(1 for _ in loader)


class _KillsFirst:
    """Crops to 16x16; the first image any worker transforms while ``armed`` exists kills the
    process whose pid is in ``victim``, then sleeps: the consumer waits in ``next()`` meanwhile
    (no batch is done before the first image is)."""

    def __init__(self, armed, victim):
        self.armed, self.victim = armed, victim

    def __call__(self, img):
        try:
            os.remove(self.armed)
        except FileNotFoundError:
            return np.ascontiguousarray(img[:16, :16])
        with open(self.victim) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        time.sleep(0.5)
        return np.ascontiguousarray(img[:16, :16])


def test_an_idle_loaders_dead_worker_is_replaced_at_its_next_pass_not_another_loaders_error(tmp_path):
    """A persistent worker of a loader between epochs is killed while the consumer waits in
    another loader's pass: that pass goes on; the idle loader's next epoch starts new workers,
    with a warning naming the one that ended (nothing of it was lost)."""
    from conftest import write_folder

    log, armed, victim_file = (os.path.join(tmp_path, name) for name in ("calls", "armed", "victim"))
    train, n = _loader(tmp_path, log)
    folder = write_folder(str(tmp_path / "folder"), per_class=8, size=(24, 24))
    val = fl.Loader(fl.ImageFolder(folder, transform=_KillsFirst(armed, victim_file)), batch_size=4, num_workers=2,
                    device="cpu")
    with train, val:
        sum(1 for _ in train)
        victim = sorted(set(_calls(log)))[0]
        with open(victim_file, "w") as f:
            f.write(str(victim))
        open(armed, "w").close()
        assert sum(len(y) for _, y in val) == len(val.dataset)
        assert not os.path.exists(armed)  # the kill happened in val's pass
        train.set_epoch(1)
        before = len(_calls(log))
        with pytest.warns(RuntimeWarning, match=f"worker process\\(es\\) {victim} ended between passes"):
            assert sorted(k for _, _, index in train for k in index.tolist()) == list(range(n))
        assert victim not in set(_calls(log)[before:])


class _StuckAt:
    """Crops to 16x16; each worker process counts its images, and the first to reach image
    ``at`` while ``armed`` exists writes ``stuck`` and sleeps ``seconds`` (one stuck sample)."""

    def __init__(self, armed, stuck, at, seconds):
        self.armed, self.stuck, self.at, self.seconds, self.count = armed, stuck, at, seconds, 0

    def __call__(self, img):
        self.count += 1
        if self.count == self.at:
            try:
                os.remove(self.armed)
            except FileNotFoundError:
                pass
            else:
                open(self.stuck, "w").close()
                time.sleep(self.seconds)
        return np.ascontiguousarray(img[:16, :16])


def test_a_sample_stuck_in_a_pass_given_up_does_not_hold_the_next_pass(tmp_path, monkeypatch):
    """Persistent workers wait for the batches a pass given up left under way for DRAIN_S at
    most; then they are replaced, with a warning naming the sample still loading."""
    from fastload.sources import worker_loader

    monkeypatch.setattr(worker_loader, "DRAIN_S", 0.5)
    data = os.path.join(tmp_path, "data")
    os.makedirs(data)
    n = _shards(data)
    armed, stuck = os.path.join(tmp_path, "armed"), os.path.join(tmp_path, "stuck")
    open(armed, "w").close()
    # Each worker is asked for 3 batches once the first is taken (2 ahead, 1 more): image 9 is its 3rd batch's first.
    ds = fl.WebDataset(data, transform=_StuckAt(armed, stuck, at=9, seconds=20))
    opts = dict(batch_size=4, num_workers=2, device="cpu", seed=3, return_index=True, normalize=False)
    with fl.Loader(ds, **opts, prefetch_factor=2) as loader:
        it = iter(loader)
        next(it)
        deadline = time.monotonic() + 10
        while not os.path.exists(stuck) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(stuck)
        del it
        loader.set_epoch(1)
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"not done within 0.5 s.*was loading record"):
            assert sorted(k for _, _, index in loader for k in index.tolist()) == list(range(n))
        assert time.monotonic() - start < 10


def test_a_program_that_turns_warnings_into_errors_gets_new_workers_all_the_same(tmp_path):
    import warnings

    from fastload.sources.inflight import process_state

    log = os.path.join(tmp_path, "calls")
    loader, n = _loader(tmp_path, log)
    with loader:
        sum(1 for _ in loader)
        victim = sorted(set(_calls(log)))[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_state(victim) not in ("gone", "dead", "dead (zombie)") and time.monotonic() < deadline:
            time.sleep(0.02)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader.set_epoch(1)
            with pytest.raises(RuntimeWarning, match="ended between passes"):
                sum(1 for _ in loader)
            loader.set_epoch(2)  # the workers were replaced before the warning: no warning now
            assert sorted(k for _, _, index in loader for k in index.tolist()) == list(range(n))
