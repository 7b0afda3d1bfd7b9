"""What PyTorch users write, checked batch by batch against a 0-worker reference.

Each test is the five-line script a user writes: a temporary Loader in a for loop, two
passes without set_epoch, break and start again, list(loader), an exception and a retry.
"""

import threading
import time

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.datasets.protocols import LoadTraits

BACKENDS = ["process", "thread"]


def _loader(ds, backend, workers=2, **kw):
    opts = dict(batch_size=5, shuffle=True, seed=5, normalize=False, device="cpu")
    opts.update(kw)
    if workers == 0:
        return fl.Loader(ds, num_workers=0, **opts)
    return fl.Loader(ds, num_workers=workers, backend=backend, **opts)


def _reference(ds, epoch, **kw):
    with _loader(ds, "process", workers=0, **kw) as ref:
        ref.set_epoch(epoch)
        return [(x.clone(), y.clone()) for x, y in ref]


def _same(got, want):
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gy, wy), (gy, wy)
        assert torch.equal(gx, wx)


@pytest.fixture(scope="module")
def ds(folder):
    return fl.ImageFolder(folder, transform=fl.transforms.train(24))


@pytest.mark.parametrize("backend", BACKENDS)
def test_temporary_loader_in_a_for_loop(ds, backend):
    got = [(x.clone(), y.clone()) for x, y in _loader(ds, backend)]
    _same(got, _reference(ds, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_passes_without_set_epoch_are_new_epochs(ds, backend):
    with _loader(ds, backend) as loader:
        first = [(x.clone(), y.clone()) for x, y in loader]
        second = [(x.clone(), y.clone()) for x, y in loader]
        assert loader.epoch == 1
    _same(first, _reference(ds, 0))
    _same(second, _reference(ds, 1))
    assert not torch.equal(first[0][1], second[0][1]), "the second pass must reshuffle"


def test_augmentation_changes_between_passes_without_shuffle(ds):
    with _loader(ds, "process", shuffle=False) as loader:
        a = torch.cat([x for x, _ in loader])
        b = torch.cat([x for x, _ in loader])
    assert not torch.equal(a, b), "same crops and flips in both passes"


def test_set_epoch_selects_the_next_pass(ds):
    with _loader(ds, "process") as loader:
        loader.set_epoch(3)
        got = [(x.clone(), y.clone()) for x, y in loader]
        then = [(x.clone(), y.clone()) for x, y in loader]
    _same(got, _reference(ds, 3))
    _same(then, _reference(ds, 4))


class _HeldInEpochZero(fl.ImageDataset):
    """Sample ``held`` of epoch 0 is written into its batch row only once ``gate`` opens."""

    load_traits = LoadTraits(takes_out=True)  # its load writes into the batch row it is given

    def __init__(self, inner, held):
        super().__init__(inner.labels)
        self.inner, self.held, self.gate = inner, held, threading.Event()

    def load(self, index, epoch=0, seed=0, out=None):
        img, label = self.inner.load(index, epoch, seed)
        if epoch == 0 and index == self.held:
            self.gate.wait(10)
        if out is None:
            return img, label
        out[...] = img
        return out, label


@pytest.mark.parametrize("backend", BACKENDS)
def test_break_then_a_new_pass(ds, backend):
    with _loader(ds, backend) as loader:
        for i, _ in enumerate(loader):
            if i == 1:
                break
        got = [(x.clone(), y.clone()) for x, y in loader]
    _same(got, _reference(ds, 1))


def test_a_late_load_of_an_abandoned_pass_stays_out_of_the_next(ds):
    """Thread backend: a load of the abandoned pass that finishes late must not be written
    into a buffer the next pass already uses."""
    held = _HeldInEpochZero(ds, held=12)  # row 2 of batch 2 (no shuffle, batch 5)
    with _loader(held, "thread", shuffle=False, normalize=True, prefetch_factor=2) as loader:
        first = iter(loader)
        next(first), next(first)  # batch 2 is now being decoded, one load stuck at the gate
        time.sleep(0.1)
        second = iter(loader)  # abandons the first pass
        got = [next(second), next(second)]
        held.gate.set()  # the stuck load of epoch 0 writes now
        time.sleep(0.2)
        got += list(second)
        got = [(x.clone(), y.clone()) for x, y in got]
    _same(got, _reference(ds, 1, shuffle=False, normalize=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_and_len(ds, backend):
    with _loader(ds, backend, normalize=True) as loader:
        batches = list(loader)
        assert len(loader) == len(batches) == 5
    ref = _reference(ds, 0, normalize=True)
    for (x, y), (rx, ry) in zip(batches, ref):
        assert torch.equal(x, rx) and torch.equal(y, ry), "list() kept batches that were later overwritten"


class _FailsOnce(fl.ImageDataset):
    load_traits = LoadTraits(takes_out=True)  # its load passes the batch row on

    def __init__(self, inner, bad):
        super().__init__(inner.labels)
        self.inner, self.bad, self.failed = inner, bad, False

    def load(self, index, epoch=0, seed=0, out=None):
        if index == self.bad and not self.failed:
            self.failed = True
            raise OSError("NFS hiccup")
        return self.inner.load(index, epoch, seed, out=out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exception_mid_epoch_then_retry(ds, backend):
    flaky = _FailsOnce(ds, bad=int(np.random.default_rng((5, 0)).permutation(len(ds))[7]))
    with _loader(flaky, backend, workers=0 if backend == "process" else 2) as loader:
        with pytest.raises(fl.SampleError, match="NFS hiccup"):
            for _ in loader:
                pass
        loader.set_epoch(0)
        got = [(x.clone(), y.clone()) for x, y in loader]
    _same(got, _reference(ds, 0))


def test_wait_share_counts_the_step():
    class Slow(fl.ImageDataset):
        def __init__(self):
            super().__init__(np.zeros(12, np.int64))

        def load(self, index, epoch=0, seed=0):
            if index % 2 == 0:
                time.sleep(0.005)  # 10 ms per batch of 2
            return np.zeros((4, 4, 3), np.uint8), 0

    with fl.Loader(Slow(), batch_size=2, num_workers=0, device="cpu") as loader:
        for _ in loader:
            time.sleep(0.1)  # the training step
        share = loader.stats()["wait_share"]
    assert 0.05 < share < 0.25, share


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_loops_over_one_loader_fail_loudly(ds, backend):
    with _loader(ds, backend) as loader:
        with pytest.raises(RuntimeError, match="ended by a newer pass"):
            for _ in loader:
                for _ in loader:
                    pass
        old = iter(loader)
        next(old)
        list(loader)  # a newer pass
        with pytest.raises(RuntimeError, match="ended by a newer pass"):
            next(old)


def test_two_threads_cannot_share_a_pass(ds):
    with _loader(_HeldInEpochZero(ds, held=2), "thread") as loader:
        errors, got = [], []
        first = threading.Thread(target=lambda: got.append(len(list(loader))), daemon=True)
        first.start()
        time.sleep(0.3)  # the first thread is inside the pass, waiting at the gate
        try:
            iter(loader)
        except RuntimeError as e:
            errors.append(str(e))
        loader.dataset.gate.set()
        first.join(10)
    assert errors and "one thread at a time" in errors[0]
    assert got == [5], "the running pass must go on"


def test_thread_backend_follows_a_new_image_size_between_passes(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(24))
    with _loader(ds, "thread", normalize=True) as loader:
        assert {tuple(x.shape[1:]) for x, _ in loader} == {(3, 24, 24)}
        ds.transform = fl.transforms.train(32)  # progressive resizing
        assert {tuple(x.shape[1:]) for x, _ in loader} == {(3, 32, 32)}


@pytest.mark.slow  # gc.get_objects() after each batch, in a process that ran many tests: about 20 s
def test_thread_backend_holds_no_finished_batches(ds):
    import gc
    from concurrent.futures import Future

    def jobs():  # each batch being made, or made and not yet handed over, is a future
        gc.collect()
        return sum(type(o) is Future for o in gc.get_objects())

    before = jobs()  # earlier tests may leave jobs of stuck samples behind
    with _loader(ds, "thread", normalize=True, batch_size=2, prefetch_factor=2) as loader:
        alive = [jobs() - before for _ in loader]
    # prefetch_factor x workers jobs ahead, plus the one handed over: not one per batch of the epoch
    assert len(alive) == 12 and max(alive) <= 2 * 2 + 1, alive
