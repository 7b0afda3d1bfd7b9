"""What a stream Loader (WebDataset) leaves in /dev/shm: nothing, once it is closed, whether its
pass was broken off after one batch or run to its end. (torch's shared memory, which its
workers used to collate into, is named after the worker that made it, ``torch_<pid>_*``, and
stays there when its batch is never received.)"""

import gc
import os
import time

import fastload as fl

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


def test_a_closed_stream_loader_leaves_no_shared_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    write_shards(tmp_path / "data", [8, 8, 8, 8])
    ds = fl.WebDataset(str(tmp_path / "data"), fl.transforms.eval(16, resize=20))
    kw = dict(batch_size=2, device="cpu", normalize=False, num_workers=2, backend="process")
    pids = set()
    dl = fl.Loader(ds, **kw)
    it = iter(dl)
    x, _ = next(it)  # broken off after one batch: the workers have more in flight
    pids |= set(dl._source.inflight.pids().values())
    del it, x
    dl.close()
    with fl.Loader(ds, **kw) as dl:  # a whole pass
        for n, _ in enumerate(dl):
            if n == 0:
                pids |= set(dl._source.inflight.pids().values())
    assert len(pids) == 4
    assert _left_by(pids) == []
