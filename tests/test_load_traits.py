"""A dataset's planning is declared (issue 37): each of fastload's indexed datasets declares what
its ``load`` is (:class:`~fastload.datasets.protocols.LoadTraits`), the declaration says what the
dataset does, and a user's dataset is loaded whole, without ``out=``, unless it declares more."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest
import torch
from conftest import write_folder

import fastload as fl
from fastload.datasets.protocols import LoadTraits, load_traits_of, planner_of
from fastload.datasets.subset import SubsetDataset
from fastload.sources.samples import Samples
from fastload.tune.measure import BytesOnly

PLANNED = LoadTraits(planned=True, takes_out=True)
WHOLE = LoadTraits()

#: Every indexed dataset class of fastload (a torch Dataset with ``load``) and what it declares.
#: A new one must be added here, and a planned one built by ``_planned_datasets`` below.
DECLARED = {
    "fastload.datasets.base.ImageDataset": PLANNED,
    "fastload.datasets.folder._FileDataset": PLANNED,
    "fastload.datasets.folder.ImageFolder": PLANNED,
    "fastload.datasets.folder.ImageList": PLANNED,
    "fastload.datasets.lmdb_dataset.LMDBDataset": PLANNED,
    "fastload.datasets.tfrecord.dataset.TFRecordDataset": PLANNED,
    "fastload.datasets.subset.SubsetDataset": LoadTraits(takes_out=True),  # passes out= on, loads whole
    "fastload.datasets.wrap.WrappedDataset": WHOLE,
    "fastload.tune.measure.BytesOnly": WHOLE,  # its own load: 1x1 images, not finish(plan(...))
    "fastload.tune.measure.Synthetic": WHOLE,
}
#: Base classes, which read no sample themselves.
ABSTRACT = {"fastload.datasets.base.ImageDataset", "fastload.datasets.folder._FileDataset"}


def _indexed_dataset_classes() -> dict[str, type]:
    """Every class of fastload that is a torch Dataset with ``load``, found by importing every
    module of the package (``__main__`` runs the command line)."""
    for module in pkgutil.walk_packages(fl.__path__, "fastload."):
        if module.name != "fastload.__main__":
            importlib.import_module(module.name)
    found, todo = {}, [torch.utils.data.Dataset]
    while todo:
        for cls in todo.pop().__subclasses__():
            todo.append(cls)
            if cls.__module__.startswith("fastload.") and callable(getattr(cls, "load", None)):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory) -> str:
    return write_folder(tmp_path_factory.mktemp("traits"), num_classes=2, per_class=2)


def _planned_datasets(root: str, where) -> dict[str, fl.ImageDataset]:
    """One of each concrete dataset class that declares itself planned, on the same images."""
    from fastload.convert import convert

    transform = fl.transforms.train(48)
    (where / "list.txt").write_text("c0/000.jpg 0\nc1/001.jpg 1\n")
    convert(root, str(where / "data.lmdb"), "lmdb", progress=False)
    convert(root, str(where / "tfr"), "tfrecord", progress=False)
    made = [
        fl.ImageFolder(root, transform),
        fl.ImageList(str(where / "list.txt"), root=root, transform=transform),
        fl.LMDBDataset(str(where / "data.lmdb"), transform),
        fl.TFRecordDataset(str(where / "tfr"), transform),
    ]
    return {f"{type(d).__module__}.{type(d).__qualname__}": d for d in made}


def test_every_indexed_dataset_of_fastload_declares_what_its_load_is():
    found = {name: load_traits_of(cls) for name, cls in _indexed_dataset_classes().items()}
    assert found == DECLARED


@pytest.mark.needs("lmdb", "tfrecord")
def test_each_declared_planner_loads_what_it_plans_and_writes_into_out(small_folder, tmp_path):
    made = _planned_datasets(small_folder, tmp_path)
    planners = {name for name, traits in DECLARED.items() if traits.planned} - ABSTRACT
    assert set(made) == planners, "a dataset class declared planned is not built here"
    for name, ds in made.items():
        assert planner_of(ds) is ds and Samples(ds).plans, name
        for index, epoch, seed in ((0, 0, 0), (1, 3, 7)):
            image, label = ds.load(index, epoch, seed)
            plan = ds.plan(index, epoch, seed)
            assert np.array_equal(image, ds.finish(plan)) and label == plan.label, name
            out = np.zeros_like(image)
            written, _ = ds.load(index, epoch, seed, out=out)
            assert written is out and np.array_equal(out, image), f"{name} declares out= but did not write into it"


def test_a_dataset_with_its_own_load_is_not_planned(small_folder):
    # BytesOnly keeps ImageDataset's plan and finish, but its load is not finish(plan(...)):
    # its load gives 1x1 images of the bytes it reads; planned, it would not even read them.
    ds = BytesOnly(fl.ImageFolder(small_folder, fl.transforms.train(48)))
    assert ds.load(0)[0].shape == (1, 1, 3) and Samples(ds).load(0, 0, 0)[0].shape == (1, 1, 3)
    with pytest.raises(NotImplementedError):
        ds.plan(0)
    assert planner_of(ds) is None and not Samples(ds).plans


def test_a_subset_passes_out_on_as_its_dataset_declares(small_folder):
    base = fl.ImageFolder(small_folder, fl.transforms.train(48))
    subset = SubsetDataset(base, [3, 1])
    samples = Samples(subset)
    assert not samples.plans
    out = np.zeros((48, 48, 3), np.uint8)
    image, label = samples.load(0, 2, 5, out=out)
    assert image is out and label == base.labels[3]
    assert np.array_equal(out, base.load(3, 2, 5)[0])


class _UsersMapStyle(torch.utils.data.Dataset):
    """A user's dataset: a torch Dataset, nothing of fastload."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        return np.full((8, 8, 3), index, np.uint8), index


class _UsersLoad(fl.ImageDataset):
    """A user's subclass with its own load, which takes out= but does not declare it."""

    def __init__(self) -> None:
        super().__init__(np.zeros(2, np.int64))
        self.given = []

    def load(self, index, epoch=0, seed=0, out=None):
        self.given.append(out)
        return np.full((8, 8, 3), 7, np.uint8), 0


class _UsersDeclaredLoad(_UsersLoad):
    load_traits = LoadTraits(takes_out=True)

    def load(self, index, epoch=0, seed=0, out=None):
        return super().load(index, epoch, seed, out)


def test_a_users_dataset_is_loaded_whole_without_out(small_folder):
    wrapped = fl.WrappedDataset(_UsersMapStyle())
    for ds in (_UsersMapStyle(), wrapped, _UsersLoad()):
        assert load_traits_of(ds) == WHOLE and planner_of(ds) is None, type(ds).__name__
    assert not Samples(wrapped).plans
    assert np.array_equal(Samples(wrapped).load(1, 0, 0, out=np.zeros((8, 8, 3), np.uint8))[0], np.full((8, 8, 3), 1))
    # Its own load runs, without the batch row, though its signature takes one.
    mine, row = _UsersLoad(), np.zeros((8, 8, 3), np.uint8)
    assert not Samples(mine).plans and Samples(mine).load(0, 0, 0, out=row)[0][0, 0, 0] == 7 and mine.given == [None]
    # Declared, it is given the row; a subclass of a fastload dataset that keeps its load still plans.
    declared = _UsersDeclaredLoad()
    Samples(declared).load(0, 0, 0, out=row)
    assert declared.given == [row] and not Samples(declared).plans

    class Renamed(fl.ImageFolder):
        def describe(self, index: int) -> str:
            return f"mine {index}"

    assert Samples(Renamed(small_folder)).plans


def test_a_wrong_declaration_is_refused():
    class Claims(_UsersMapStyle):
        load_traits = LoadTraits(planned=True)  # but has no plan and finish

    with pytest.raises(TypeError, match="declares LoadTraits\\(planned=True\\) but has no plan and finish"):
        Samples(Claims())
