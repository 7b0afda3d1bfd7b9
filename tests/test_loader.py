import os
import time
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import fastload as fl
from fastload.decode import DecodeError

from conftest import write_folder


def _epoch_bytes(loader, epoch):
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def test_output_contract_on_cpu(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(32))
    with fl.Loader(ds, batch_size=10, num_workers=0, device="cpu") as loader:
        assert len(loader) == 3
        batches = list(loader)
    assert [len(y) for _, y in batches] == [10, 10, 4]
    x, y = batches[0]
    assert x.shape == (10, 3, 32, 32) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert y.dtype == torch.int64 and y.tolist() == [0] * 8 + [1] * 2
    assert -2.2 < x.min() < -1 and 2.0 < x.max() < 2.7  # ImageNet-normalized range


@pytest.mark.parametrize("workers,start", [(2, "fork"), (2, "spawn")])
def test_workers_and_start_methods_give_identical_batches(folder, workers, start):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(24))
    opts = dict(batch_size=5, shuffle=True, seed=7, normalize=False, device="cpu")
    with fl.Loader(ds, num_workers=0, **opts) as ref:
        want = [_epoch_bytes(ref, e) for e in (0, 1)]
    with fl.Loader(ds, num_workers=workers, multiprocessing_context=start, **opts) as loader:
        got = [_epoch_bytes(loader, e) for e in (0, 1)]
    for w_epoch, g_epoch in zip(want, got):
        assert len(w_epoch) == len(g_epoch) == 5
        for (wx, wy), (gx, gy) in zip(w_epoch, g_epoch):
            assert torch.equal(wx, gx) and torch.equal(wy, gy)
    assert not torch.equal(want[0][0][0], want[1][0][0]), "epoch 1 should reshuffle"


def test_uint8_output_layout(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.eval(16, resize=20))
    with fl.Loader(ds, batch_size=4, num_workers=0, normalize=False, device="cpu") as loader:
        x, _ = next(iter(loader))
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 16, 16)
    assert x.is_contiguous(memory_format=torch.channels_last)
    ref = ds.load(0, 0, 0)[0]
    assert np.array_equal(x[0].permute(1, 2, 0).numpy(), ref)


@pytest.mark.parametrize("reduced,tolerance", [(False, 0.08), (True, 0.15)])
def test_matches_independent_pillow_pipeline(folder, reduced, tolerance):
    """Loader tensors ≈ Pillow decode + resize + centre crop + normalize, right labels.

    0.08 is ~4/255 in pixel units (resampling kernels differ); DCT-scaled decoding
    filters differently again, most visibly on these noise-heavy test images.
    """
    ds = fl.ImageFolder(folder, transform=fl.transforms.eval(64, resize=73, reduced_decode=reduced))
    mean, std = np.array(fl.config.IMAGENET_MEAN), np.array(fl.config.IMAGENET_STD)
    with fl.Loader(ds, batch_size=8, num_workers=2, device="cpu") as loader:
        seen = 0
        for x, y in loader:
            for img, label in zip(x, y):
                path = ds.path(seen)
                pil = Image.open(path).convert("RGB")
                w, h = pil.size
                nw, nh = (73, int(73 * h / w)) if w <= h else (int(73 * w / h), 73)
                pil = pil.resize((nw, nh), Image.Resampling.BILINEAR)
                top, left = round((nh - 64) / 2), round((nw - 64) / 2)
                ref = np.asarray(pil)[top : top + 64, left : left + 64] / 255.0
                ref = ((ref - mean) / std).transpose(2, 0, 1)
                assert np.abs(img.numpy() - ref).mean() < tolerance
                assert label.item() == ds.class_to_idx[os.path.basename(os.path.dirname(path))]
                seen += 1
    assert seen == len(ds)


def test_bad_sample_raise_names_file_through_workers(tmp_path):
    write_folder(tmp_path, num_classes=1, per_class=6)
    (tmp_path / "c0" / "003.jpg").write_bytes(b"\xff\xd8 broken")
    ds = fl.ImageFolder(tmp_path, transform=fl.transforms.train(16))
    with fl.Loader(ds, batch_size=3, num_workers=2, device="cpu") as loader:
        with pytest.raises(DecodeError, match=r"sample 3 \(.*003\.jpg\)"):
            list(loader)


def test_bad_sample_skip_replaces_counts_and_warns(tmp_path):
    write_folder(tmp_path, num_classes=1, per_class=6)
    (tmp_path / "c0" / "003.jpg").write_bytes(b"\xff\xd8 broken")
    ds = fl.ImageFolder(tmp_path, transform=fl.transforms.train(16))
    with fl.Loader(ds, batch_size=3, num_workers=2, device="cpu", on_error="skip") as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sizes = [len(y) for _, y in loader]
        assert sizes == [3, 3]
        assert loader.stats()["skipped"] >= 1
    assert any("skipped 1 bad sample" in str(w.message) and "003.jpg" in str(w.message) for w in caught)


def test_close_is_idempotent_and_stops_workers(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(16))
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    loader = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu")
    next(iter(loader))
    pids = [p.pid for p in multiprocessing.active_children() if p.pid not in before]
    assert len(pids) == 2
    loader.close()
    loader.close()
    deadline = time.monotonic() + 10
    while any(p.pid in pids for p in multiprocessing.active_children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.pid in pids for p in multiprocessing.active_children()), "workers still running"
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_options_are_validated(folder):
    ds = fl.ImageFolder(folder)
    with pytest.raises(TypeError, match="unknown Loader option.*batchsize"):
        fl.Loader(ds, batchsize=3)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        fl.Loader(ds, batch_size=0)
    with pytest.raises(ValueError, match="on_error"):
        fl.Loader(ds, on_error="ignore")
    with pytest.raises(ValueError, match="CUDA is not available"):
        if not torch.cuda.is_available():
            fl.Loader(ds, device="cuda")
        else:
            raise ValueError("CUDA is not available (skipped on a GPU machine)")
    with pytest.raises(TypeError, match="needs __len__ and __getitem__"):
        fl.Loader(object())
    cfg = fl.LoaderConfig(batch_size=4, num_workers=0, device="cpu")
    assert fl.Loader(ds, cfg, batch_size=6).config.batch_size == 6


def test_explicit_rank_shards_the_epoch(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.eval(8, resize=10))
    seen = []
    for rank in range(2):
        with fl.Loader(ds, batch_size=5, num_workers=0, device="cpu", shuffle=True,
                       shard=fl.Shard(rank=rank, world_size=2), normalize=False) as loader:
            assert len(loader) == 3
            for x, y in loader:
                seen.extend(y.tolist())
    assert sorted(seen) == sorted(ds.labels.tolist())


def test_fork_after_opencv_threads_ran_does_not_hang(folder):
    """OpenCV's pool, used in the parent, must not deadlock forked workers."""
    import cv2

    cv2.setNumThreads(2)
    big = np.zeros((1500, 1500, 3), np.float32)
    for _ in range(3):
        cv2.resize(big, (700, 700), interpolation=cv2.INTER_CUBIC)
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(16))
    with fl.Loader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork", device="cpu", timeout=30) as loader:
        assert sum(len(y) for _, y in loader) == len(ds)
    assert cv2.getNumThreads() == 2


class _LosesABatch:
    """Stands in for the DataLoader: one batch, then the hand-over of the next breaks."""

    def __iter__(self):
        yield "batch"
        raise ConnectionResetError("peer gone")


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_lost_in_transit_becomes_a_worker_error(folder, workers):
    from fastload.sources import PassRequest, ProcessSource

    loader = fl.Loader(fl.ImageFolder(folder), batch_size=4, num_workers=workers, device="cpu")
    source = loader._source
    assert isinstance(source, ProcessSource)
    source.workers._loader = _LosesABatch()
    batches = source.batches(PassRequest(0, 0))
    assert next(batches) == "batch"
    if workers == 0:  # in-process loading keeps the dataset's own error
        with pytest.raises(ConnectionResetError):
            next(batches)
        return
    with pytest.raises(RuntimeError, match="lost a DataLoader worker") as info:
        next(batches)
    assert isinstance(info.value.__cause__, ConnectionResetError)
