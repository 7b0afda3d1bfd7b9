"""Workers started while a decode="gpu" decoder is alive in this process are not forked from
it: on an H200, workers forked beside a TFRecord stream's GPU decoders crashed in the fork
(benchmarks/results/2026-11-28-gpu). The start method is decided as workers start: a fork
server while a decoder lives (workers that are not persistent, e.g. a stream's next pass with
persistent_workers=False; another Loader's workers), fork otherwise (persistent workers, an
indexed dataset's or a stream's, start before any decoder)."""

import gc
import multiprocessing
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_gpu_decode import _photos, _write
from test_gpu_streams import _stream

import fastload as fl
from fastload.decode import roi
from fastload.sources import start
from fastload.sources.start import gpu_decoders_live, worker_start_method

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not roi.available(), reason="GPU decode needs nvImageCodec: fastload[roi]")


@pytest.fixture
def contexts(monkeypatch):
    """The start method of each start of workers (a DataLoader iterated whose workers are not
    running already: torch keeps persistent ones in ``_iterator``)."""
    seen = []
    iterate = torch.utils.data.DataLoader.__iter__

    def recording(self):
        if self.num_workers > 0 and (not self.persistent_workers or self._iterator is None):
            ctx = self.multiprocessing_context
            seen.append(ctx.get_start_method() if ctx is not None else None)
        return iterate(self)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__iter__", recording)
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    return seen


def _two_passes(ds, **kw):
    """The samples of two passes (epochs 0 and 1)."""
    counts = []
    with fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", seed=0, **kw) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            counts.append(sum(len(b[1]) for b in loader))
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["tfrecord", "wds"])
def test_a_streams_next_pass_beside_its_gpu_decoders_comes_from_a_fork_server(tmp_path, contexts, kind, persistent):
    ds = _stream(kind, tmp_path / kind, list(_photos(8).values()), fl.transforms.train(48, reduced_decode=False))
    assert _two_passes(ds, decode="gpu", persistent_workers=persistent) == [8, 8]
    # The decoders start with the first pass's batches: new workers for the second come from a
    # fork server; persistent ones, forked before the decoders, run the second pass too.
    assert contexts == (["fork"] if persistent else ["fork", "forkserver"])


@pytest.mark.slow
def test_workers_started_while_another_loaders_gpu_decoders_live_come_from_a_fork_server(tmp_path, contexts):
    ds = fl.ImageFolder(_write(tmp_path, _photos(8)), fl.transforms.train(48, reduced_decode=False))
    train = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", seed=0, decode="gpu")
    val = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", seed=0)  # made before any decoder
    next(iter(train))  # its persistent workers forked before its decoder, which now lives
    assert gpu_decoders_live() > 0
    assert sum(len(b[1]) for b in val) == 8  # started now: beside the decoder
    assert _two_passes(ds, decode="cpu") == [8, 8]
    assert _two_passes(ds, decode="gpu", persistent_workers=False) == [8, 8]
    assert contexts == ["fork", "forkserver", "forkserver", "forkserver", "forkserver"], contexts
    val.close()
    train.close()
    del train
    gc.collect()
    assert gpu_decoders_live() == 0
    contexts.clear()
    assert _two_passes(ds, decode="cpu") == [8, 8]
    assert contexts == ["fork"]


def test_the_start_method_a_user_names_is_kept(monkeypatch):
    monkeypatch.setattr(start, "_live", [1])
    assert worker_start_method("spawn") == "spawn"
    if sys.platform.startswith("linux"):
        assert worker_start_method(None) == "forkserver"
        monkeypatch.setattr(start, "_live", [0])
        assert worker_start_method(None) in ("fork", multiprocessing.get_start_method(allow_none=True))


@pytest.mark.slow
def test_a_script_whose_loop_is_not_guarded_is_told_so_when_its_stream_workers_die_starting(tmp_path):
    _stream("wds", tmp_path / "wds", list(_photos(4).values()), None)
    script = tmp_path / "train.py"
    script.write_text(
        "import fastload as fl\n"  # no `if __name__ == "__main__":`, as many scripts are
        f"ds = fl.WebDataset({str(tmp_path / 'wds')!r}, transform=fl.transforms.train(32, reduced_decode=False))\n"
        "loader = fl.Loader(ds, decode='gpu', batch_size=2, num_workers=1, device='cpu', timeout=60,\n"
        "                   persistent_workers=False)\n"
        "for epoch in range(2):  # the second pass's workers start beside the GPU decoders\n"
        "    loader.set_epoch(epoch)\n"
        "    print(sum(len(b[1]) for b in loader))\n"
    )
    env = {**os.environ, "FASTLOAD_GPU_DECODE_ON_CPU": "1", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "is your loop under `if __name__ == '__main__':`?" in run.stderr.splitlines()[-1], run.stderr[-2000:]
    # The workers refused the script's loop as they imported it: its first pass ran once, here.
    assert run.stdout.split() == ["4"], run.stdout
    assert "a Loader pass was started while this process starts as a worker" in run.stderr


def test_a_dataset_that_does_not_pickle_is_told_why_the_fork_server_and_how_to_fork(monkeypatch):
    monkeypatch.setattr(start, "_live", [1])  # as while a decode="gpu" decoder is alive

    class Local(torch.utils.data.Dataset):  # defined in a function: it does not pickle
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.zeros((8, 8, 3), np.uint8), i

    with fl.Loader(Local(), batch_size=2, num_workers=1, device="cpu") as loader:
        with pytest.raises((pickle.PicklingError, TypeError, AttributeError), match=r"fork server because a "
                           r"decode='gpu' decoder is alive.*multiprocessing_context='fork'"):
            next(iter(loader))
