"""Strict by default with region decode: a sample libjpeg calls corrupt never reaches a batch."""

import copy
import io
import os
import pickle
import warnings

import numpy as np
import pytest
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler

import fastload as fl
from fastload.decode import DecodeError, costs, plan, roi
from fastload.decode.clean import CleanMarks

from conftest import flip_scan_bytes, jpeg_bytes, make_image

ROI = pytest.mark.skipif(not roi.available(), reason="region decode needs: pip install 'fastload[roi]'")


@pytest.fixture
def region_everywhere():
    """A planner that takes a region decode wherever one may serve (the worst case for
    strictness): forked workers and threads inherit it."""
    c = copy.deepcopy(costs.DEFAULT_COSTS)
    c["decode"]["region"] = [0.0, 0.0, 0.0]
    plan.set_planner(plan.Planner(c, region=roi.available()))
    yield
    plan.set_planner(None)


def _complains(data: bytes) -> bool:
    import simplejpeg

    try:
        simplejpeg.decode_jpeg(data, strict=True)
    except ValueError:
        return True
    return False


def _damaged(data: bytes) -> bytes:
    """A copy of ``data`` that libjpeg warns about (corrupt entropy data) but decodes."""
    for seed in range(200):
        bad = flip_scan_bytes(data, seed)
        import simplejpeg

        if _complains(bad) and simplejpeg.decode_jpeg(bad, strict=False) is not None:
            return bad
    raise AssertionError("no damage libjpeg only warns about")


def _pid_marks(marks: CleanMarks, index: int) -> None:
    marks.mark(index)
    os._exit(0)


def test_marks_are_shared_with_forked_workers_and_through_torchs_pickler():
    marks = CleanMarks(8)
    assert not marks.is_clean(3) and marks.count() == 0
    proc = mp.get_context("fork").Process(target=_pid_marks, args=(marks, 3))
    proc.start()
    proc.join(30)
    assert marks.is_clean(3) and marks.count() == 1
    # Spawned workers receive the dataset through torch's ForkingPickler: the same memory.
    other = pickle.loads(ForkingPickler.dumps(marks))
    other.mark(5)
    assert marks.is_clean(5)
    assert not marks.is_clean(8) and not marks.is_clean(-1)  # out of range: never clean
    marks.mark(99)
    assert marks.count() == 2


class _Memory(fl.ImageDataset):
    def __init__(self, blobs, transform):
        super().__init__(np.zeros(len(blobs), np.int64), transform)
        self.blobs = blobs

    def read(self, index):
        return self.blobs[index], 0

    def describe(self, index):
        return f"mem://{index}.jpg"


@ROI
def test_first_decode_is_strict_and_only_samples_that_passed_are_marked(region_everywhere):
    clean = jpeg_bytes(make_image(1, 200, 260))
    ds = _Memory([clean, _damaged(clean)], fl.transforms.train(32, scale=(0.05, 0.2)))
    assert ds.clean.count() == 0 and len(ds.clean) == 2
    for epoch in range(3):
        ds.load(0, epoch)
        with pytest.raises(DecodeError, match=r"sample 1 \(mem://1.jpg\): libjpeg-turbo: Corrupt JPEG data"):
            ds.load(1, epoch)
    assert ds.clean.is_clean(0) and not ds.clean.is_clean(1)
    # Pillow decodes no JPEG strictly: nothing it decodes is marked.
    pil = _Memory([clean], fl.transforms.train(32))
    pil.decoder = "pillow"
    pil.load(0)
    assert not pil.clean.is_clean(0)


def _folder(tmp_path, clean: int, damaged: int) -> tuple[str, set[str]]:
    root = tmp_path / "data" / "c0"
    root.mkdir(parents=True)
    bad = set()
    for i in range(clean + damaged):
        data = jpeg_bytes(make_image(100 + i, 96, 128))
        name = f"{i:03d}.jpg"
        if i % ((clean + damaged) // damaged) == 1 and len(bad) < damaged:
            data = _damaged(data)
            bad.add(name)
        (root / name).write_bytes(data)
    return str(tmp_path / "data"), bad


@ROI
@pytest.mark.parametrize("backend", ["process", "thread"])
def test_no_damaged_jpeg_reaches_a_batch_in_60_epochs(tmp_path, backend, region_everywhere):
    """With region decode wherever it may serve, a JPEG libjpeg calls corrupt is skipped
    (on_error="skip") or raised (default) in every epoch, never delivered."""
    root, bad = _folder(tmp_path, clean=6, damaged=2)
    ds = fl.ImageFolder(root, transform=fl.transforms.train(24, scale=(0.05, 0.3)))
    damaged = {i for i in range(len(ds)) if os.path.basename(ds.describe(i)) in bad}
    options = dict(batch_size=4, num_workers=2, backend=backend, device="cpu", return_index=True, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip warnings
        with fl.Loader(ds, on_error="skip", **options) as loader:
            for epoch in range(60):
                seen = [int(i) for _, _, idx in loader for i in idx]
                assert not damaged & set(seen), f"epoch {epoch} delivered a damaged JPEG"
                assert {s.index for s in loader.skipped if s.epoch == epoch} == damaged
    raised = 0
    with fl.Loader(ds, **options) as loader:
        for _ in range(60):
            with pytest.raises(DecodeError, match="Corrupt JPEG data") as info:
                for _ in loader:
                    pass
            assert any(name in str(info.value) for name in bad)
            raised += 1
    assert raised == 60
    assert ds.clean.count() == len(ds) - len(damaged)  # marked by workers or threads, seen here
