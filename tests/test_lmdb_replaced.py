"""An LMDB replaced while a dataset is open (issue 32 item 6): by an atomic rename of a larger
conversion, or a copy over the file. Every read is checked: the original sample's bytes, or a
named LMDBChangedError; never another file's image under the old label."""

import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest

import fastload as fl
from fastload.convert import convert
from fastload.datasets import LMDBChangedError, lmdb_guard_registry
from fastload.datasets.lmdb_dataset import close_env

from conftest import jpeg_bytes
from guards import close_guard

pytestmark = pytest.mark.needs("lmdb")
OPTS = dict(batch_size=4, device="cpu", normalize=False, shuffle=False, return_index=True)


def _noise_folder(root, per_class, seed):
    rng = np.random.default_rng(seed)
    for c in range(2):
        os.makedirs(root / f"c{c}")
        for i in range(per_class):
            (root / f"c{c}" / f"{i:02d}.jpg").write_bytes(jpeg_bytes(rng.integers(0, 256, (24, 32, 3), np.uint8)))
    return str(root)


@pytest.fixture(scope="module")
def two_lmdbs(tmp_path_factory):
    """(old, new): two conversions with the same keys, other images, the new one larger."""
    tmp = tmp_path_factory.mktemp("replaced")
    old, new = str(tmp / "old.lmdb"), str(tmp / "new.lmdb")
    convert(_noise_folder(tmp / "a", 6, 0), old, "lmdb", progress=False)
    convert(_noise_folder(tmp / "b", 9, 1), new, "lmdb", progress=False)
    assert os.path.getsize(os.path.join(new, "data.mdb")) > os.path.getsize(os.path.join(old, "data.mdb"))
    return old, new


@pytest.fixture
def live(two_lmdbs, tmp_path):
    """A copy of the old LMDB in use, and the new data file ready beside it to be renamed over it."""
    old, new = two_lmdbs
    path = str(tmp_path / "data.lmdb")
    shutil.copytree(old, path)
    shutil.copyfile(os.path.join(new, "data.mdb"), str(tmp_path / "incoming.mdb"))
    yield path, str(tmp_path / "incoming.mdb")
    close_guard(path)


def _commit(path):
    """A writer's commit to the LMDB at ``path`` (under lmdb's own locking)."""
    import lmdb

    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"extra", b"x" * 100_000)
    env.close()


def _guard(path):
    """This process's guard of ``path``."""
    real = os.path.realpath(path)
    (guard,) = [g for k, g in lmdb_guard_registry._guards.items() if k[:2] == (real, os.getpid())]
    return guard


def _reads(ds, expected):
    """(right, wrong, named errors) over every sample read once."""
    right = wrong = named = 0
    for i in range(len(ds)):
        try:
            got = ds.read(i)
        except LMDBChangedError as e:
            assert "was replaced by another file" in str(e) and ds.path in str(e), str(e)
            named += 1
            continue
        right, wrong = (right + 1, wrong) if got == expected[i] else (right, wrong + 1)
    return right, wrong, named


@pytest.mark.parametrize("guard", [None, False])
def test_a_data_file_renamed_over_is_named_never_read(live, guard):
    """Read right after the rename (the old file still mapped) and after the map is made again (a
    guard killed by the OOM killer and restarted; an environment opened again): each read is a
    named error, none the new file's image (before: 0 errors, then every sample wrong)."""
    path, incoming = live
    ds = fl.LMDBDataset(path, guard=guard)
    expected = [ds.read(i) for i in range(len(ds))]
    os.replace(incoming, os.path.join(path, "data.mdb"))  # what a converter writing beside it and renaming does
    at_once = _reads(ds, expected)
    if guard is None:
        g = _guard(path)
        os.kill(g.proc.pid, signal.SIGKILL)
        g.proc.wait()
    else:
        close_env(path)
    assert [at_once, _reads(ds, expected)] == [(0, 0, len(ds))] * 2, "(right, wrong, named) reads"


def test_a_read_in_flight_when_a_new_dataset_ends_its_guard_names_the_change(live):
    """A dataset made again after the rename ends the old file's guard while a thread reads
    through it: that read is a named LMDBChangedError (it got the raw OSError of a pipe closed
    under it), and the new dataset reads the new file."""
    path, incoming = live
    old = fl.LMDBDataset(path)
    old.read(0)
    guard = _guard(path)
    pid, out = guard.proc.pid, {}

    def read():
        try:
            out["value"] = old.read(1)
        except BaseException as e:  # the test looks at it
            out["value"] = e

    os.kill(pid, signal.SIGSTOP)  # the old dataset's read waits for its answer
    try:
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not guard.lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the request sent, its answer awaited
        os.replace(incoming, os.path.join(path, "data.mdb"))
        new = fl.LMDBDataset(path)  # its guard replaces the old file's
        reader.join(15)
        assert not reader.is_alive(), "the read in flight is still blocked"
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    got = out["value"]
    assert isinstance(got, LMDBChangedError), repr(got)
    assert "was replaced by another file" in str(got) and path in str(got), str(got)
    assert len(new) == 18 and guard.proc is None


def test_new_workers_never_read_the_replacement(live):
    """Non-persistent workers open the file again each pass: after the rename, every batch is an
    error naming the file, none holds the new file's images."""
    path, incoming = live
    ds = fl.LMDBDataset(path, fl.transforms.eval(16))
    expected = {i: ds.load(i)[0] for i in range(len(ds))}
    with fl.Loader(ds, num_workers=2, persistent_workers=False, on_error="skip", **OPTS) as loader:
        for images, _, indices in loader:
            for image, i in zip(images.numpy(), indices.tolist()):
                assert np.array_equal(image.transpose(1, 2, 0), expected[i])
        os.replace(incoming, os.path.join(path, "data.mdb"))
        with pytest.raises(Exception, match=r"was replaced by another file") as e:
            for images, _, indices in loader:
                wrong = [i for image, i in zip(images.numpy(), indices.tolist())
                         if not np.array_equal(image.transpose(1, 2, 0), expected[i])]
                assert not wrong, f"samples {wrong} are another file's images"
        assert "data.mdb" in str(e.value)


def test_a_copy_over_the_file_is_named(live):
    """cp over the open file keeps its inode: its size and time tell, before any read of it."""
    path, incoming = live
    ds = fl.LMDBDataset(path)
    ds.read(0)
    shutil.copyfile(incoming, os.path.join(path, "data.mdb"))
    with pytest.raises(LMDBChangedError, match=r"data\.mdb was written to \(size [\d,]+ -> [\d,]+ bytes"):
        ds.read(0)


def test_a_rewrite_that_keeps_size_and_time_is_named_when_a_process_opens_it(live):
    """The header pages' hash, checked whenever a process opens the file (a new guard, a worker)."""
    path, _ = live
    ds = fl.LMDBDataset(path)
    ds.read(0)
    close_guard(path)
    data = os.path.join(path, "data.mdb")
    st = os.stat(data)
    with open(data, "r+b") as f:  # another transaction id in the first meta page, as a new conversion has
        f.seek(16 + 128)
        txn = int.from_bytes(f.read(8), "little")
        f.seek(16 + 128)
        f.write((txn + 7).to_bytes(8, "little"))
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # cp -p, rsync -t
    with pytest.raises(LMDBChangedError, match=r"was rewritten \(its header pages differ\)"):
        ds.read(0)


def test_lock_true_allows_a_writer(live):
    """With lock=True a writer may commit while the dataset reads (LMDB's locking): not an error."""
    path, _ = live
    ds = fl.LMDBDataset(path, lock=True)
    first = ds.read(0)
    _commit(path)
    assert ds.read(0) == first


def test_datasets_of_a_file_with_a_writer_share_one_guard(live):
    """lock=True: a commit between two datasets' opening changes the file's size and time, not
    the file. Each read of one ended the other's guard (a process started per read; a read in
    flight on the other failed): they share one."""
    path, _ = live
    first = fl.LMDBDataset(path, lock=True)
    expected = first.read(0)
    _commit(path)
    second = fl.LMDBDataset(path, lock=True)
    pids = set()
    for ds in (first, second, first, second):
        assert ds.read(0) == expected
        pids.add(_guard(path).proc.pid)
    assert len(pids) == 1, f"{len(pids)} guard processes for 4 reads"


@pytest.mark.parametrize("guard", [None, False])
def test_a_dataset_made_again_reads_the_new_file_and_the_old_one_stays_an_error(live, two_lmdbs, guard):
    path, incoming = live
    old = fl.LMDBDataset(path, guard=guard)
    old.read(0)
    os.replace(incoming, os.path.join(path, "data.mdb"))
    new = fl.LMDBDataset(path, guard=guard)
    assert len(new) == 18 and new.read(17) == fl.LMDBDataset(two_lmdbs[1], guard=guard).read(17)
    with pytest.raises(LMDBChangedError):
        old.read(0)
    assert new.read(0) == fl.LMDBDataset(two_lmdbs[1], guard=guard).read(0)  # the old one's error ended nothing
