"""A stream's worker whose slot is read while another reads on is ended by DataLoader: its
exit is not a death. Before, the pass failed a tick later ("worker 1 ... was loading no
sample"), whenever one slot ended a quarter of a second before the others: a slow worker
start (a fork server's) or shards of unequal length."""

import io
import os
import tarfile
import time

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, make_image

import fastload as fl


class Slow:
    """A transform taking ``seconds`` per image (the long slot's batches come after the short slot ended)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, img):
        time.sleep(self.seconds)
        return np.ascontiguousarray(img[:32, :32])


def _shard(path, keys):
    with tarfile.open(path, "w") as t:
        for k in keys:
            for name, value in ((f"s{k:05d}.jpg", jpeg_bytes(make_image(k, 40, 48))), (f"s{k:05d}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(value)
                t.addfile(info, io.BytesIO(value))


@pytest.mark.parametrize("persistent", [False, True])  # False: DataLoader ends the worker; True: it idles
@pytest.mark.parametrize("start_method", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_a_slot_that_ends_first_ends_its_worker_and_the_pass_goes_on(tmp_path, start_method, persistent):
    _shard(os.path.join(tmp_path, "shard-000000.tar"), range(0, 12))  # slot 0: 6 batches, 0.3 s each
    _shard(os.path.join(tmp_path, "shard-000001.tar"), range(12, 14))  # slot 1: one batch
    ds = fl.WebDataset(str(tmp_path), transform=Slow(0.15))
    opts = dict(batch_size=2, num_workers=2, device="cpu", seed=0, shuffle=False, return_index=True)
    with fl.Loader(ds, **opts, multiprocessing_context=start_method, persistent_workers=persistent) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(k for _, _, index in loader for k in index.tolist()) == list(range(14))


def test_a_thread_backends_timeout_does_not_blame_the_start_of_worker_processes():
    class Stuck(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(2.0)
            return np.zeros((8, 8, 3), np.uint8), 0

    with fl.Loader(Stuck(), batch_size=2, num_workers=1, backend="thread", timeout=0.5, device="cpu") as loader:
        with pytest.raises(fl.WorkerFailure) as got:
            next(iter(loader))
    assert "timed out" in str(got.value) and "registering" not in str(got.value), got.value
