"""Workers started while decode="gpu"'s decoders run in this process are not forked from it:
on an H200 a TFRecord stream's second pass (new workers, the decoders' threads running)
crashed in the fork, both workers (benchmarks/results/2026-11-28-gpu). A stream's workers
start each pass, and so do workers that are not persistent: those come from a fork server.
Persistent workers of an indexed dataset start before any decoder, and fork as before."""

import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
from test_gpu_decode import _photos, _write
from test_gpu_streams import _stream

import fastload as fl
from fastload.decode import roi
from fastload.sources.start import worker_start_method

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not roi.available(), reason="GPU decode needs nvImageCodec: fastload[roi]")


@pytest.fixture
def contexts(monkeypatch):
    """The start method of every DataLoader iterated (its multiprocessing_context)."""
    seen = []
    iterate = torch.utils.data.DataLoader.__iter__

    def recording(self):
        if self.num_workers > 0:
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
@pytest.mark.parametrize("kind", ["tfrecord", "wds"])
def test_a_streams_workers_beside_gpu_decode_come_from_a_fork_server(tmp_path, contexts, kind):
    ds = _stream(kind, tmp_path / kind, list(_photos(8).values()), fl.transforms.train(48, reduced_decode=False))
    assert _two_passes(ds, decode="gpu") == [8, 8]
    assert contexts == ["forkserver", "forkserver"]  # a pass each
    contexts.clear()
    assert _two_passes(ds, decode="cpu") == [8, 8]
    assert "forkserver" not in contexts


@pytest.mark.slow
def test_workers_that_are_not_persistent_beside_gpu_decode_come_from_a_fork_server(tmp_path, contexts):
    ds = fl.ImageFolder(_write(tmp_path, _photos(8)), fl.transforms.train(48, reduced_decode=False))
    assert _two_passes(ds, decode="gpu", persistent_workers=False) == [8, 8]
    assert contexts == ["forkserver", "forkserver"]
    contexts.clear()
    assert _two_passes(ds, decode="gpu") == [8, 8]  # persistent: forked once, before any decoder
    assert "forkserver" not in contexts


def test_the_start_method_a_user_names_is_kept():
    assert worker_start_method("spawn", beside_gpu_decode=True) == "spawn"
    if sys.platform.startswith("linux"):
        assert worker_start_method(None, beside_gpu_decode=True) == "forkserver"
        assert worker_start_method(None) in ("fork", multiprocessing.get_start_method(allow_none=True))


@pytest.mark.slow
def test_a_script_whose_loop_is_not_guarded_is_told_so_when_its_stream_workers_die_starting(tmp_path):
    _stream("wds", tmp_path / "wds", list(_photos(4).values()), None)
    script = tmp_path / "train.py"
    script.write_text(
        "import fastload as fl\n"  # no `if __name__ == "__main__":`, as many scripts are
        f"ds = fl.WebDataset({str(tmp_path / 'wds')!r}, transform=fl.transforms.train(32, reduced_decode=False))\n"
        "loader = fl.Loader(ds, decode='gpu', batch_size=2, num_workers=1, device='cpu', timeout=60)\n"
        "print(sum(len(b[1]) for b in loader))\n"
    )
    env = {**os.environ, "FASTLOAD_GPU_DECODE_ON_CPU": "1", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "is your loop under `if __name__ == '__main__':`?" in run.stderr.splitlines()[-1], run.stderr[-2000:]
