"""Copy-on-read (pytorch issue 13246): a worker's memory stays flat over a million-sample index.

Each worker's USS (its private pages, /proc/PID/smaps_rollup) is read from the test
process during a shuffled pass, for fastload's index (``ImageList.from_arrays``) and, in
the same run, for a torch Dataset holding a Python list: the list's growth is the proof
that the probe sees copy-on-read.

A forked worker copies a page of the parent's when it writes to it: the list dataset
does on every sample (reference counts), and CPython's full garbage collection does for
every object the parent had tracked (issue 32 item 8: +37 MB per worker at the first full
collection in each worker, some 170 batches of 256 into the pass).
"""

import gc
import os
import weakref

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.sources.frozen import parent_objects_frozen

from conftest import children, jpeg_bytes, make_image, uss_mb

N = 1_000_000
FLAT_MB = 5.0  # per worker, over the pass (issue 32: "≤ 5 MB per worker on a 1M index")


def index_paths(n: int) -> list[str]:
    # ImageNet-like relative paths; each resolves (through its class folder) to one of 8 files:
    # the index is what is measured, not the images.
    return [f"n{i % 100:08d}/../img{i % 8}.jpg" for i in range(n)]


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("cor")
    for c in range(100):
        os.mkdir(root / f"n{c:08d}")
    for k in range(8):
        (root / f"img{k}.jpg").write_bytes(jpeg_bytes(make_image(k, 16, 16)))
    return str(root)


class CollectAt:
    """A transform that runs a full garbage collection at the ``at``-th image each process
    transforms: what CPython does on its own in a long-running worker, sooner."""

    def __init__(self, at: int) -> None:
        self.at, self.seen = at, 0

    def __call__(self, img: np.ndarray) -> np.ndarray:
        self.seen += 1
        if self.seen == self.at:
            gc.collect()
        return img


class ListIndex(torch.utils.data.Dataset):
    """What most datasets do: a list of (path, label) tuples."""

    def __init__(self, root: str, paths: list[str], transform=None) -> None:
        self.samples = [(os.path.join(root, p), i % 1000) for i, p in enumerate(paths)]
        self.image = make_image(0, 16, 16)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        _, label = self.samples[i]  # the path too: its reference count is written
        return (self.transform(self.image) if self.transform else self.image), label


def worker_growth(dataset, batch_size: int, first: int, last: int, **kw) -> list[float]:
    """USS growth (MiB) of each of 2 workers between batch ``first`` and batch ``last`` of a
    shuffled pass."""
    earlier = children()
    loader = fl.Loader(
        dataset, batch_size=batch_size, num_workers=2, shuffle=True, seed=0, device="cpu", normalize=False, **kw
    )
    try:
        for i, _ in enumerate(loader):
            if i == first:
                workers = children() - earlier
                assert len(workers) == 2, workers
                start = {pid: uss_mb(pid) for pid in workers}
            if i == last:
                return [uss_mb(pid) - start[pid] for pid in sorted(start)]
    finally:
        loader.close()
    raise AssertionError(f"the pass ended before batch {last}")


@pytest.fixture(scope="module")
def paths() -> list[str]:
    return index_paths(N)


def test_a_full_collection_in_a_worker_copies_nothing(image_root, paths):
    """Each worker collects once (at its 11th batch), between the two readings: fastload's
    index stays flat; the list dataset grows by the reference counts it writes."""
    bs, first, last = 64, 4, 80  # batch 4: no worker is past its 5th; batch 80: each past its 35th
    at = 10 * bs + 1

    ours = fl.ImageList.from_arrays(paths, np.arange(N) % 1000, image_root, transform=[CollectAt(at)])
    fastload_growth = worker_growth(ours, bs, first, last)
    listed = ListIndex(image_root, paths, CollectAt(at))
    list_growth = worker_growth(listed, bs, first, last)

    print(f"USS growth per worker (MiB): fastload index {fastload_growth}, Python list {list_growth}")
    assert min(list_growth) > 3 * FLAT_MB, f"the probe saw no growth even for a Python list: {list_growth}"
    assert max(fastload_growth) <= FLAT_MB, f"workers grew {fastload_growth} MiB on fastload's index"


@pytest.mark.slow  # about a minute: run by make test-slow (.ci/run)
def test_workers_stay_flat_over_470_batches(image_root, paths):
    """Issue 32 item 8 as reported: 2 workers, 470 shuffled batches of 256 on a 1M index,
    readings at batch 10 and 470, no collection forced (CPython's own came at about batch
    170 in each worker: +37 MB each)."""
    ours = fl.ImageList.from_arrays(paths, np.arange(N) % 1000, image_root, transform=fl.transforms.train(16))
    fastload_growth = worker_growth(ours, 256, 10, 470)
    list_growth = worker_growth(ListIndex(image_root, paths), 256, 10, 470)

    print(f"USS growth per worker (MiB): fastload index {fastload_growth}, Python list {list_growth}")
    assert min(list_growth) > 10 * FLAT_MB, f"the probe saw no growth even for a Python list: {list_growth}"
    assert max(fastload_growth) <= FLAT_MB, f"workers grew {fastload_growth} MiB on fastload's index"


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_program_still_collects_objects_it_made_before_the_workers(folder):
    """The objects are frozen only while workers are forked: a cycle the program made
    before and drops after is collected as before."""
    before = gc.get_freeze_count()
    cycle = Cycle()
    ref = weakref.ref(cycle)
    loader = fl.Loader(fl.ImageFolder(folder, transform=fl.transforms.eval(16)), batch_size=4, num_workers=2)
    next(iter(loader))
    assert gc.get_freeze_count() == before
    del cycle
    gc.collect()
    assert ref() is None, "a cycle made before the workers started is never collected"
    loader.close()


def test_objects_the_program_froze_itself_stay_frozen():
    frozen = Cycle()
    gc.freeze()
    try:
        with parent_objects_frozen(), parent_objects_frozen():
            pass
        assert gc.get_freeze_count() > 0
        ref = weakref.ref(frozen)
        del frozen
        gc.collect()
        assert ref() is not None, "fastload unfroze what the program had frozen"
    finally:
        gc.unfreeze()
