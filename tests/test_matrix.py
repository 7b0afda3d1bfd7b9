"""Issue 37: every source on every runner, each decoder, one view or several: exactly once per
epoch, a pass resumed mid-epoch, close() mid-pass. A cell is refused only with an error that
says why (REFUSED: the reason the architecture guide's matrix gives). The worker-process cells
start processes: those are slow-marked (``make test-slow``, which CI runs)."""

import glob
import os
import warnings

import numpy as np
import pytest
import torch

import fastload as fl
from conftest import need_formats, write_folder
from fastload.convert import convert
from fastload.decode import roi

SOURCES = ["folder", "list", "lmdb", "tfrecord", "tfrecord-stream", "wds", "wds-http", "user"]
RUNNERS = {"in-process": dict(num_workers=0), "threads": dict(num_workers=2, backend="thread"),
           "processes": dict(num_workers=2, backend="process")}
N, BATCH = 12, 4

#: Cells refused: (error, its message's start, why). The guide's matrix is made from these
#: and refusal() by tools/arch_counts.py.
REFUSED = {
    ("user", "gpu"): (TypeError, "decode='gpu' needs a fastload dataset",
                      "a user's items are pixels, not the bytes GPU decode needs"),
}


def refusal(source, decode, views):
    """The (error, message, why) a cell is refused with; None for a cell that runs."""
    return REFUSED.get((source, decode)) or REFUSED.get((source, decode, views))


class UserDataset(torch.utils.data.Dataset):
    """A user's own map-style dataset: decoded pixels and a label (views: a tuple of them)."""

    def __init__(self, views):
        self.views = views

    def __len__(self):
        return N

    def __getitem__(self, i):
        img = np.full((16, 16, 3), i, np.uint8)
        return ((img, np.full((8, 8, 3), i, np.uint8)) if self.views > 1 else img), i % 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    folder = write_folder(root / "folder", num_classes=3, per_class=N // 3, size=(40, 48))
    paths = sorted(glob.glob(os.path.join(folder, "*", "*.jpg")))
    with open(root / "list.txt", "w") as f:
        f.writelines(f"{os.path.relpath(p, folder)} {k % 3}\n" for k, p in enumerate(paths))
    out = {"folder": folder, "list": str(root / "list.txt"), "root": folder}
    need_formats("lmdb", "tfrecord")
    for fmt in ("lmdb", "tfrecord", "wds"):
        out[fmt] = str(root / fmt)
        convert(folder, out[fmt], fmt, workers=1, progress=False, **({"shard_samples": 5} if fmt == "wds" else {}))
    return out


def _transform(views, gpu):
    one = fl.transforms.train(16, reduced_decode=not gpu)
    return fl.transforms.MultiView([one, fl.transforms.train(8)]) if views > 1 else one


def _dataset(source, data, views, gpu, url=None):
    tf = _transform(views, gpu)
    if source == "folder":
        return fl.ImageFolder(data["folder"], tf)
    if source == "list":
        return fl.ImageList(data["list"], data["root"], transform=tf)
    if source == "lmdb":
        return fl.LMDBDataset(data["lmdb"], tf)
    if source == "tfrecord":
        return fl.TFRecordDataset(sorted(glob.glob(os.path.join(data["tfrecord"], "data-*-of-*[0-9]"))), transform=tf)
    if source == "tfrecord-stream":
        return fl.TFRecordStream(sorted(glob.glob(os.path.join(data["tfrecord"], "data-*-of-*[0-9]"))), transform=tf)
    if source == "wds":
        return fl.WebDataset(data["wds"], transform=tf)
    if source == "wds-http":
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(data["wds"], "*.tar")))
        return fl.WebDataset([f"{url}/{name}" for name in names], transform=tf, cache_dir=data["root"] + "-cache")
    return UserDataset(views)


def _loader(ds, runner, gpu, **kw):
    return fl.Loader(ds, batch_size=BATCH, device="cpu", normalize=False, return_index=True, seed=5,
                     decode="gpu" if gpu else "cpu", **RUNNERS[runner], **kw)


def _indices(batches):
    return sorted(i for b in batches for i in b[-1].tolist())


def _check_cell(source, runner, decode, views, data, url=None):
    gpu = decode == "gpu"
    ds = _dataset(source, data, views, gpu, url)
    refused = refusal(source, decode, views)
    if refused is not None:
        with pytest.raises(refused[0], match=refused[1]):
            with _loader(ds, runner, gpu) as loader:
                next(iter(loader))
        return
    with _loader(ds, runner, gpu) as loader:
        for epoch in (0, 1):  # exactly once per epoch, each sample with its own label
            loader.set_epoch(epoch)
            batches = list(loader)
            assert _indices(batches) == list(range(N)), (epoch, _indices(batches))
            first = batches[0][0][0] if views > 1 else batches[0][0]
            assert first.shape[0] == BATCH and first.dtype == torch.uint8
            if views > 1:
                assert [tuple(v.shape[1:]) for v in batches[0][0]] == [(3, 16, 16), (3, 8, 8)]
        it = iter(loader)  # resumed mid-epoch: the rest of the epoch, nothing twice
        head = [next(it)]
        state = loader.state_dict()
        with pytest.raises(RuntimeError, match="close"):  # close() mid-pass ends the pass
            loader.close()
            next(it)
    with _loader(ds, runner, gpu) as again:
        again.load_state_dict(state)
        assert _indices(head + list(again)) == list(range(N))


CELLS = [
    pytest.param(source, runner, decode, views,
                 marks=[pytest.mark.slow] if runner == "processes" or source == "wds-http" else [],
                 id=f"{source}-{runner}-{decode}-{views}view")
    for source in SOURCES for runner in RUNNERS for decode in ("cpu", "gpu") for views in (1, 2)
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("source, runner, decode, views", CELLS)
def test_every_source_runs_on_every_runner_and_decoder(source, runner, decode, views, data, monkeypatch):
    if decode == "gpu":
        if not roi.available():
            pytest.skip("decode='gpu' on the CPU needs nvImageCodec's CPU backend: pip install 'fastload[roi]'")
        monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if source != "wds-http":
            _check_cell(source, runner, decode, views, data)
            return
        from wds_servers import http_server

        with http_server(data["wds"]) as (url, _):
            _check_cell(source, runner, decode, views, data, url)
