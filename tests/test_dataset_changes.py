"""Persistent workers copy the dataset as they start: a change between epochs (a new
transform for progressive resizing, an attribute the dataset's own ``set_epoch`` sets, a
fastload pipeline's setting changed in place) starts new workers, which see it, with a
warning naming what changed (``fastload/datasets/changes.py``). Torch's DataLoader would go
on with the old copy. ``decode="gpu"`` follows a new transform on every runner."""

import multiprocessing.util
import os
import time
import warnings

import numpy as np
import pytest
import torch
from conftest import children, write_folder
from golden import write_shards

import fastload as fl
from fastload.datasets.changes import changed, snapshot
from fastload.datasets.subset import SubsetDataset
from fastload.datasets.wrap import WrappedDataset

CHANGED = "changed since its persistent worker processes copied it"


class Scale:
    """A user's transform with a setting a program may change in place."""

    def __init__(self, factor):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


class Counting(torch.utils.data.Dataset):
    """Images whose target says which epoch the dataset was told (hundreds) and what its
    transform makes of 1 (units)."""

    def __init__(self, n=8):
        self.n, self.epoch, self.transform = n, 0, Scale(1)
        self._cache = {}

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self._cache[i] = os.getpid()  # private: per process, by design
        return np.zeros((4, 4, 3), np.uint8), 100 * self.epoch + self.transform(1)


class Holder(torch.utils.data.Dataset):
    def __init__(self, dataset):
        self.dataset = dataset


class Crop:
    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        return np.ascontiguousarray(img[: self.size, : self.size])


def test_changed_names_what_was_set_added_or_removed():
    inner = Counting()
    ds = Holder(inner)
    before = snapshot(ds)
    assert changed(before, ds) == []
    inner._cache["x"] = 1  # private
    inner.epoch = 0  # the same plain value again
    inner.n = int("8")  # an equal int, maybe another object
    inner.transform.factor = 3  # inside a user's object: not looked into (nothing is pickled or called)
    assert changed(before, ds) == []
    inner.set_epoch(1)
    inner.extra = []
    del inner.n
    assert changed(before, ds) == ["dataset.epoch", "dataset.extra", "dataset.n"]
    before = snapshot(ds)
    inner.epoch = 1.0  # equal, but another type: the workers would compute with an int
    inner.transform = Scale(3)
    assert changed(before, ds) == ["dataset.epoch", "dataset.transform"]
    inner.pair = (Equal(), 1)
    before = snapshot(ds)
    inner.pair = (Equal(), 1)  # another object that says it is equal: no __eq__ is asked
    assert changed(before, ds) == ["dataset.pair"]


class Equal:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def test_a_fastload_pipeline_is_compared_by_its_settings():
    ds = Holder(None)
    ds.transform = fl.transforms.train(32)
    before = snapshot(ds)
    ds.transform.transforms[0].size = (16, 16)
    assert changed(before, ds) == ["transform"]
    before = snapshot(ds)
    ds.transform = fl.transforms.Compose(list(ds.transform.transforms))  # the same transforms, wrapped again
    assert changed(before, ds) == []
    ds.transform = fl.transforms.train(32, reduced_decode=False)  # a setting its repr does not show
    assert changed(before, ds) == ["transform"]


def test_the_loaders_wrappers_are_looked_through_and_a_concat_datasets_parts_looked_into(tmp_path):
    user = Counting()
    wrapped = WrappedDataset(user, transform=None)
    before = snapshot(wrapped)
    user.set_epoch(2)
    assert changed(before, wrapped) == ["epoch"]  # the user's name, not dataset.epoch
    wrapped.transform = fl.transforms.eval(8)
    assert changed(before, wrapped) == ["epoch", "loader.transform"]  # the Loader's transform= named apart
    folder = fl.ImageFolder(write_folder(tmp_path, num_classes=1, per_class=4))
    sub = SubsetDataset(folder, [0, 2])
    sub.given = torch.utils.data.Subset(folder, [0, 2])
    before = snapshot(sub)
    sub.given.indices = [1]  # the Loader copied them: not what the workers load
    assert changed(before, sub) == []
    folder.transform = fl.transforms.eval(16)
    assert changed(before, sub) == ["transform"]
    a, b = Counting(), Counting()
    concat = torch.utils.data.ConcatDataset([a, b])
    before = snapshot(concat)
    b.transform = Scale(2)
    assert changed(before, concat) == ["datasets[1].transform"]
    parts = torch.utils.data.ConcatDataset([folder])
    before = snapshot(parts)
    folder.set_epoch(3)  # read by index there: its __getitem__ loads with it
    assert changed(before, parts) == ["datasets[0].epoch"]
    before = snapshot(folder)
    folder.set_epoch(4)  # loaded by the Loader itself, with the Loader's epoch
    assert changed(before, folder) == []


def _epochs(loader, epochs, between):
    """Each epoch's (epochs, transform values) told by its targets, ``between(epoch)`` called
    before every epoch but the first."""
    out = []
    for epoch in range(epochs):
        if epoch:
            between(epoch)
        loader.set_epoch(epoch)
        targets = {int(t) for _, batch in loader for t in batch}
        out.append((sorted({t // 100 for t in targets}), sorted({t % 100 for t in targets})))
    return out


def test_a_datasets_set_epoch_reaches_persistent_workers():
    ds = Counting()
    loader = fl.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.warns(RuntimeWarning, match=r"the dataset's 'epoch' " + CHANGED):
        seen = _epochs(loader, 3, ds.set_epoch)
    assert [told for told, _ in seen] == [[0], [1], [2]]
    loader.close()


def test_a_new_transform_of_a_concat_datasets_part_reaches_persistent_workers():
    a, b = Counting(4), Counting(4)
    loader = fl.DataLoader(torch.utils.data.ConcatDataset([a, b]), batch_size=4, num_workers=2, persistent_workers=True)

    def scale(epoch):
        a.transform = b.transform = Scale(10)

    with pytest.warns(RuntimeWarning, match=r"'datasets\[0\].transform', 'datasets\[1\].transform' " + CHANGED):
        seen = _epochs(loader, 2, scale)
    assert [made for _, made in seen] == [[1], [10]]
    loader.close()


@pytest.mark.parametrize("persistent", [True, False])
def test_no_warning_where_no_worker_is_replaced(persistent):
    """Persistent workers of an unchanged dataset are kept, silently; workers started every
    epoch see a change with no warning."""
    ds = Counting()
    loader = fl.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen = _epochs(loader, 3, (lambda epoch: None) if persistent else ds.set_epoch)
    loader.close()
    assert [told for told, _ in seen] == ([[0], [0], [0]] if persistent else [[0], [1], [2]])


def _sizes(loader, epochs, between):
    """Each epoch's image sizes, and the change warnings given, ``between(epoch)`` called
    before every epoch but the first."""
    sizes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(epochs):
            if epoch:
                between(epoch)
            loader.set_epoch(epoch)
            sizes.append({tuple(images.shape[2:]) for images, _ in loader})
    loader.close()
    return sizes, [str(w.message) for w in caught if CHANGED in str(w.message)]


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_progressive_resizing_an_image_folder(tmp_path, backend):
    """fl.Loader's workers persist by default: a new transform each epoch gives that epoch's size
    (on threads, which share the dataset, with no warning)."""
    ds = fl.ImageFolder(write_folder(tmp_path, num_classes=2, per_class=4), transform=fl.transforms.train(32))
    loader = fl.Loader(ds, batch_size=4, num_workers=2, backend=backend, device="cpu", normalize=False)

    def resize(epoch):
        ds.transform = fl.transforms.train(32 - 8 * epoch)

    sizes, said = _sizes(loader, 3, resize)
    assert sizes == [{(32, 32)}, {(24, 24)}, {(16, 16)}]
    assert len(said) == (2 if backend == "process" else 0), said
    assert all("'transform'" in m for m in said)


def test_a_pipelines_setting_changed_in_place_reaches_persistent_workers(tmp_path):
    ds = fl.ImageFolder(write_folder(tmp_path, num_classes=1, per_class=4), transform=fl.transforms.train(32))
    loader = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", normalize=False)

    def resize(epoch):
        ds.transform.transforms[0].size = (16, 16)

    sizes, said = _sizes(loader, 2, resize)
    assert sizes == [{(32, 32)}, {(16, 16)}] and len(said) == 1


def test_the_set_epoch_of_a_fastload_dataset_inside_a_concat_dataset_reaches_persistent_workers(tmp_path):
    """There the workers call its __getitem__, which loads with its own epoch: each epoch's crops differ."""
    part = fl.ImageFolder(write_folder(tmp_path, num_classes=1, per_class=4), transform=fl.transforms.train(16))
    loader = fl.DataLoader(torch.utils.data.ConcatDataset([part]), batch_size=4, num_workers=2, persistent_workers=True)
    pixels = []
    with pytest.warns(RuntimeWarning, match=r"'datasets\[0\].epoch' " + CHANGED):
        for epoch in range(3):
            part.set_epoch(epoch)
            pixels.append(torch.cat([images for images, _ in loader]))
    loader.close()
    assert not torch.equal(pixels[0], pixels[1]) and not torch.equal(pixels[1], pixels[2])


def test_a_fastload_datasets_own_set_epoch_replaces_no_worker(tmp_path):
    """timm's train.py calls dataset.set_epoch each epoch; a Loader passes its own epochs."""
    ds = fl.ImageFolder(write_folder(tmp_path, num_classes=1, per_class=4), transform=fl.transforms.train(16))
    loader = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", normalize=False)
    sizes, said = _sizes(loader, 3, ds.set_epoch)
    assert ds.epoch == 2 and said == []


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_gpu_decode_follows_a_new_transform(tmp_path, monkeypatch, backend):
    """decode="gpu" runs the transform on the device: a new one gets its device pipeline
    (it failed, or kept the old size, before)."""
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    ds = fl.ImageFolder(write_folder(tmp_path, num_classes=2, per_class=4), transform=fl.transforms.train(32))
    loader = fl.Loader(ds, batch_size=4, num_workers=2, backend=backend, device="cpu", normalize=False, decode="gpu")

    def resize(epoch):
        ds.transform = fl.transforms.train(32 - 8 * epoch)

    sizes, _ = _sizes(loader, 3, resize)
    assert sizes == [{(32, 32)}, {(24, 24)}, {(16, 16)}]


def test_gpu_decode_keeps_its_workers_for_a_new_transform_set_alike(tmp_path, monkeypatch):
    """A schedule that assigns ``train(size)`` every epoch, the size unchanged: no new source."""
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    ds = fl.ImageFolder(write_folder(tmp_path, num_classes=1, per_class=4), transform=fl.transforms.train(16))
    loader = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", normalize=False, decode="gpu")
    workers = []
    for _ in range(3):
        ds.transform = fl.transforms.train(16)
        list(loader)
        workers.append(children())
    loader.close()
    assert workers[0] == workers[1] == workers[2]


def test_a_streams_persistent_workers_see_a_new_transform(tmp_path):
    ds = fl.WebDataset(write_shards(str(tmp_path / "shards"), (8, 8), size=(24, 24)), transform=Crop(16))
    loader = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", normalize=False)

    def crop(epoch):
        if epoch == 2:
            ds.transform = Crop(8)

    sizes, said = _sizes(loader, 3, crop)
    assert sizes == [{(16, 16)}, {(16, 16)}, {(8, 8)}]
    assert len(said) == 1 and "'transform'" in said[0]


def test_a_plain_callable_set_as_transform_is_wrapped_as_the_constructor_wraps_it(tmp_path):
    ds = fl.ImageFolder(write_folder(tmp_path, num_classes=1, per_class=2), transform=Crop(8))
    ds.transform = Crop(4)  # not a Compose: it would fail at the next load unwrapped
    image, _ = ds[0]
    assert sorted(image.shape) == [3, 4, 4]


class LogsExit(Counting):
    """Counting whose worker processes write their pid to ``log`` as they exit their own way
    (multiprocessing's finalizers run then; a killed process runs none)."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def __getitem__(self, i):
        if os.getpid() not in self._cache:
            self._cache[os.getpid()] = True
            log = self.log
            multiprocessing.util.Finalize(None, lambda: open(log, "a").write(f"{os.getpid()}\n"), exitpriority=10)
        return super().__getitem__(i)


def test_workers_replaced_for_a_change_exit_their_own_way(tmp_path):
    """Idle and drained, they are asked to exit, not killed: three generations, six clean exits."""
    log = str(tmp_path / "exits")
    open(log, "w").close()
    ds = LogsExit(log)
    loader = fl.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.warns(RuntimeWarning, match=CHANGED):
        _epochs(loader, 3, ds.set_epoch)
    loader.close()
    deadline = time.monotonic() + 10
    while len(open(log).read().split()) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(open(log).read().split()) == 6
