"""What a Loader with worker processes leaves in /dev/shm: nothing, once it is closed, whether its
pass was broken off after one batch, run to its end or ended by a worker killed mid-pass; for an
indexed dataset (ImageFolder) and a stream (WebDataset), with decode="cpu" and decode="gpu" (whose
workers pack the bytes for the device: run here on the CPU, FASTLOAD_GPU_DECODE_ON_CPU=1).
(torch's shared memory, which workers used to collate and pack into, is named after the worker
that made it, ``torch_<pid>_*``, and stays there when its batch is never received.)"""

import gc
import os
import signal
import time

import pytest

import fastload as fl
from fastload.decode import roi

from wds_servers import write_shards


def _left_by(pids, wait_s=2.0):
    """The /dev/shm entries of processes ``pids``, once the workers' shutdown (in the background)
    has dropped what it held."""
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    deadline = time.monotonic() + wait_s
    while True:
        gc.collect()
        left = [n for n in os.listdir("/dev/shm") if n.startswith(prefixes)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _workers(dl, n=2, wait_s=10.0):
    """worker -> pid of ``dl``'s ``n`` workers, once each has registered (a worker still starting has not)."""
    deadline = time.monotonic() + wait_s
    while len(pids := dl._source.inflight.pids()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return pids


def _source(kind, folder, tmp_path):
    tf = fl.transforms.eval(16, resize=20)
    if kind == "indexed":
        return fl.ImageFolder(folder, tf)
    write_shards(tmp_path / "data", [8, 8, 8, 8])
    return fl.WebDataset(str(tmp_path / "data"), tf)


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
@pytest.mark.parametrize("kind", ["indexed", "stream"])
def test_a_closed_loader_leaves_no_shared_memory(kind, decode, folder, tmp_path, monkeypatch):
    if decode == "gpu":
        if not roi.available():
            pytest.skip("decode='gpu' on the CPU needs nvImageCodec: fastload[roi]")
        monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    ds = _source(kind, folder, tmp_path)
    kw = dict(batch_size=2, device="cpu", normalize=False, num_workers=2, backend="process", decode=decode)
    pids = set()
    dl = fl.Loader(ds, **kw)
    it = iter(dl)
    x, _ = next(it)  # broken off after one batch: the workers have more in flight
    pids |= set(_workers(dl).values())
    del it, x
    dl.close()
    with fl.Loader(ds, **kw) as dl:  # a whole pass
        for n, _ in enumerate(dl):
            if n == 0:
                pids |= set(_workers(dl).values())
    with fl.Loader(ds, **kw) as dl:  # a worker killed mid-pass, with batches in flight
        it = iter(dl)
        next(it)
        workers = _workers(dl)
        pids |= set(workers.values())
        os.kill(workers[0], signal.SIGKILL)
        with pytest.raises(fl.WorkerFailure):
            for _ in it:
                pass
        del it
    assert len(pids) == 6
    assert _left_by(pids) == []


class _Dies(fl.WebDataset):
    """The worker that reads record ``dies`` is killed there (a crash in a decoder)."""

    dies = 5

    def plan_record(self, record, epoch, seed):
        if record.number == self.dies:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().plan_record(record, epoch, seed)


def test_a_worker_that_dies_in_a_stream_record_is_named_by_shard_key_and_offset(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    write_shards(tmp_path / "data", [8, 8])
    ds = _Dies(str(tmp_path / "data"), fl.transforms.eval(16, resize=20))
    where = ds.table.where(_Dies.dies)
    assert ".tar" in where and "byte" in where, where
    with fl.Loader(ds, batch_size=2, device="cpu", normalize=False, num_workers=2, backend="process",
                   stall_warning=0) as dl:
        with pytest.raises(fl.WorkerFailure) as failure:
            for _ in dl:
                pass
    message = str(failure.value)
    assert f"was loading record {_Dies.dies} ({where}) for " in message, message


def test_the_stall_warning_names_a_stream_record_as_its_worker_named_it():
    from fastload.sources.inflight import NAME_BYTES, InFlight
    from fastload.sources.watchdog import Watchdog

    table = InFlight(2)
    table.begin(0, 23, 0, "record 23 (a/shard-1.tar sample 'k23' at byte 11776)")
    table.begin(1, 7, 0, "x" * (NAME_BYTES + 9))  # longer than the table's room: cut
    table.begin(1, 8, 0, "record 8 (b.tar)")  # the row reused by a shorter name
    message = Watchdog(table, None, after=0).message(30)
    assert "worker 0 (pid %d) on record 23 (a/shard-1.tar sample 'k23' at byte 11776) for" % os.getpid() in message
    assert "on record 8 (b.tar) for" in message, message
    table.begin(1, 9, 0)  # an indexed sample: named by the dataset, in this process
    assert "on sample 9 (sample 9) for" in Watchdog(table, None, after=0).message(30)
