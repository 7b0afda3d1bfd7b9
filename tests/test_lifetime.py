"""A Loader that goes out of scope is freed at once, with its workers: no reference cycle.

What users write: a new Loader per epoch or per evaluation, rebound in a loop or a
notebook cell, never closed. Each test runs with the cyclic garbage collector off, so
only reference counting can free what a dropped Loader holds.
"""

import gc
import os
import threading
import weakref
from contextlib import contextmanager

import pytest

import fastload as fl

from conftest import children, uss_mb

BACKENDS = ["process", "thread"]


@contextmanager
def no_cyclic_gc():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@pytest.fixture(scope="module")
def ds(folder):
    return fl.ImageFolder(folder, transform=fl.transforms.train(24))


def _three_batches(ds, backend):
    loader = fl.Loader(ds, batch_size=4, num_workers=2, backend=backend, device="cpu", shuffle=True)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    return loader


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dropped_loader_is_freed_at_once(ds, backend):
    before = children()
    with no_cyclic_gc():
        loader = _three_batches(ds, backend)
        workers = children() - before
        ref = weakref.ref(loader)
        del loader
        assert ref() is None, "a reference cycle keeps the dropped Loader alive"
        assert not workers & children(), "its worker processes outlived it"


@pytest.mark.parametrize("kind", ["indexed", "stream"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closed_loader_leaves_nothing_in_a_reference_cycle(ds, folder, tmp_path, kind, backend):
    # A user review: each closed Loader left its source (its WorkerLoader held the source's own
    # methods) and two shared-memory descriptors until the cyclic gc ran, though the guide says
    # nothing holds it in a reference cycle.
    if kind == "stream":
        from fastload.convert import convert

        convert(folder, str(tmp_path / "wds"), "wds", progress=False, shard_samples=8)
        data = fl.WebDataset(str(tmp_path / "wds" / "shard-*.tar"), transform=fl.transforms.eval(16, resize=16))
    else:
        data = ds
    with no_cyclic_gc():
        gc.collect()
        loader = fl.Loader(data, batch_size=4, num_workers=2, backend=backend, device="cpu")
        assert sum(len(x) for x, _ in loader) > 0
        source = weakref.ref(loader._source)
        loader.close()
        del loader
        assert source() is None, "the closed Loader's source is kept alive by a reference cycle"
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            ours = [type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("fastload.")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert not ours, f"in reference cycles: {sorted(set(ours))}"


@pytest.mark.parametrize("backend,rebinds", [("process", 30), ("thread", 100)])
def test_rebinding_loaders_leaves_nothing_behind(ds, backend, rebinds, capfd):
    earlier, earlier_threads = children(), set(threading.enumerate())

    def counts() -> tuple[int, int]:
        return len(children() - earlier), len(set(threading.enumerate()) - earlier_threads)

    with no_cyclic_gc():
        loader = _three_batches(ds, backend)
        one = counts()
        before = uss_mb()
        peak = one
        for _ in range(rebinds):
            loader = _three_batches(ds, backend)  # noqa: F841 - rebinding drops the previous one
            peak = tuple(max(a, b) for a, b in zip(peak, counts()))
        grown = uss_mb() - before
        del loader
    assert peak[0] <= one[0], f"{peak[0]} worker processes at once; one Loader has {one[0]}"
    # A closing loader's shutdown thread may still be exiting while the next one starts.
    assert peak[1] <= one[1] + 2, f"{peak[1]} threads at once; one Loader has {one[1]}"
    assert grown < 50, f"memory grew by {grown:.0f} MB over {rebinds} loaders"
    assert capfd.readouterr().err == ""


def test_a_forked_child_does_not_close_its_parents_workers(ds):
    loader = _three_batches(ds, "process")
    pid = os.fork()
    if pid == 0:  # the child drops its copy, as a forked worker's garbage collector would
        try:
            loader.close()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len([b for b in loader]) == 6, "the parent's workers were stopped by the child"
    loader.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_from_another_thread_stops_a_running_pass(backend):
    import time

    import numpy as np

    class Long(fl.ImageDataset):
        def __init__(self):
            super().__init__(np.zeros(2000, np.int64))

        def load(self, index, epoch=0, seed=0):
            time.sleep(0.005)  # the consumer waits inside next(): close() lands while the pass runs
            return np.zeros((4, 4, 3), np.uint8), 0

    earlier = children()
    loader = fl.Loader(Long(), batch_size=4, num_workers=2, backend=backend, device="cpu")
    got, ended = [], []

    def train():
        try:
            for batch in loader:
                got.append(len(batch[1]))
        except RuntimeError as e:
            ended.append(str(e))

    consumer = threading.Thread(target=train)
    consumer.start()
    while len(got) < 3:
        time.sleep(0.01)
    workers = children() - earlier
    loader.close()
    consumer.join(5)
    assert not consumer.is_alive() and ended and "close()" in ended[0], (len(got), ended)
    assert len(got) < 100, f"the pass went on for {len(got)} batches after close()"
    deadline = time.monotonic() + 3
    while workers & children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not workers & children(), "the workers outlived close()"


def test_a_next_while_another_thread_closes_the_pass_is_the_documented_error():
    # Issue 40 (trust round 5): close() from another thread during a stream pass closed the pass's
    # generator there while _ended_by was set only afterwards: the consumer's next() met the closing
    # generator and raised Python's raw "ValueError: generator already executing".
    from fastload.loading.passes import Pass
    from fastload.sources.failures import PassClosed

    closing, release = threading.Event(), threading.Event()

    def batches():
        try:
            while True:
                yield 1
        finally:  # a stream's cleanup: takes a while
            closing.set()
            release.wait(5)

    owner = object()
    p = Pass(owner, batches())
    assert next(p) == 1
    closer = threading.Thread(target=p.end, args=("close()",))
    closer.start()
    assert closing.wait(5)
    try:
        with pytest.raises(PassClosed, match=r"closed \(close\(\)\) during this pass"):
            next(p)
    finally:
        release.set()
        closer.join(5)
    with pytest.raises(PassClosed, match=r"closed \(close\(\)\) during this pass"):
        next(p)
