import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import fastload as fl
from fastload.convert import convert

from conftest import jpeg_bytes, make_image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.needs("lmdb")


@pytest.fixture(scope="module")
def lmdb_path(folder, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lmdb") / "data.lmdb")
    convert(folder, path, "lmdb", progress=False)
    return path


def _foreign(path, values):
    import lmdb

    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()


def test_metadata_and_reads(lmdb_path, folder):
    ds = fl.LMDBDataset(lmdb_path, transform=fl.transforms.train(16))
    src = fl.ImageFolder(folder)
    assert len(ds) == len(src) and ds.classes == src.classes and ds.labels.tolist() == src.labels.tolist()
    assert ds.read(5)[0] == src.read(5)[0]
    img, label = ds.load(5, epoch=1, seed=2)
    assert img.shape == (16, 16, 3) and label == src.labels[5]
    assert ds.env_options == {"readonly": True, "lock": False, "readahead": False, "meminit": False}


def test_two_datasets_on_one_path_and_pickling(lmdb_path):
    a, b = fl.LMDBDataset(lmdb_path), fl.LMDBDataset(lmdb_path)  # lmdb refuses a second open
    assert a.read(0) == b.read(0)
    c = pickle.loads(pickle.dumps(a))
    assert c.read(3) == a.read(3)


@pytest.mark.parametrize("start", ["fork", "spawn", "forkserver"])
def test_workers_under_every_start_method(lmdb_path, start):
    ds = fl.LMDBDataset(lmdb_path, transform=fl.transforms.train(16))
    ds.read(0)  # the parent has an open environment when workers start
    with fl.Loader(ds, batch_size=8, num_workers=2, multiprocessing_context=start, device="cpu") as loader:
        labels = [y for _, batch in loader for y in batch.tolist()]
    assert labels == ds.labels.tolist()


def test_buffers_off_gives_same_result(lmdb_path):
    on, off = fl.LMDBDataset(lmdb_path), fl.LMDBDataset(lmdb_path, buffers=False)
    assert np.array_equal(on.load(2)[0], off.load(2)[0])


def test_foreign_lmdb_needs_parse_and_reads_through_it(tmp_path):
    path = str(tmp_path / "foreign")
    data = [jpeg_bytes(make_image(i, 20, 30)) for i in range(3)]
    _foreign(path, {f"img-{i}".encode(): bytes([i]) + d for i, d in enumerate(data)})
    with pytest.raises(ValueError, match="not written by fastload.*parse="):
        fl.LMDBDataset(path)
    ds = fl.LMDBDataset(path, parse=lambda v: (v[1:], v[0]))
    assert ds.labels.tolist() == [0, 1, 2]
    assert ds.read(2) == (data[2], 2)
    assert ds.load(1)[0].shape == (20, 30, 3)


def test_pickled_values_only_with_explicit_opt_in(tmp_path):
    path = str(tmp_path / "pickled")
    img = jpeg_bytes(make_image(0, 20, 30))
    _foreign(path, {b"a": pickle.dumps((img, 4)), b"b": pickle.dumps({"image": img, "label": 7})})
    with pytest.raises(ValueError, match="allow_pickle=True"):
        fl.LMDBDataset(path)
    ds = fl.LMDBDataset(path, allow_pickle=True)
    assert ds.labels.tolist() == [4, 7] and ds.read(1) == (img, 7)


def test_errors_name_path_and_key(tmp_path, lmdb_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        fl.LMDBDataset(tmp_path / "nowhere")
    path = str(tmp_path / "copy.lmdb")
    convert(lmdb_path, path, "lmdb", progress=False)
    import lmdb

    # Damaged before the dataset opens it (a file written to while open is an error of its own).
    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"%09d" % 1, b"\xff\xd8 garbage")
        txn.delete(b"%09d" % 2)
    env.close()
    ds = fl.LMDBDataset(path)
    with pytest.raises(fl.DecodeError, match=r"sample 1 \(.*copy\.lmdb key b'000000001'\)"):
        ds.load(1)
    with pytest.raises(KeyError, match="key b'000000002' .*missing"):
        ds.load(2)


def test_read_only_directory(lmdb_path, tmp_path):
    ro = tmp_path / "ro.lmdb"
    convert(lmdb_path, str(ro), "lmdb", progress=False)
    os.remove(ro / "lock.mdb")  # reading must not need (or create) the lock file
    for f in os.listdir(ro):
        os.chmod(ro / f, 0o444)
    os.chmod(ro, 0o555)
    try:
        ds = fl.LMDBDataset(ro)
        assert len(ds.read(0)[0]) > 0 and not os.path.exists(ro / "lock.mdb")
    finally:
        os.chmod(ro, 0o755)


TRUNCATE = r"""
import os, shutil, sys
import fastload as fl
src, work = sys.argv[1], sys.argv[2]
size = os.path.getsize(os.path.join(src, "data.mdb"))
for fraction in (0.3, 0.5, 0.8, 0.95, 0.999):
    path = os.path.join(work, f"cut{fraction}")
    shutil.copytree(src, path)
    os.truncate(os.path.join(path, "data.mdb"), int(size * fraction))
    try:
        fl.LMDBDataset(path).load(0)
    except ValueError as e:
        print("opened", fraction, e)
# Cut while open: the next read must not touch a page past the end either.
path = os.path.join(work, "open")
shutil.copytree(src, path)
ds = fl.LMDBDataset(path)
ds.read(0)
os.truncate(os.path.join(path, "data.mdb"), size // 3)
try:
    ds.read(len(ds) - 1)
except ValueError as e:
    print("reading", e)
"""


def test_truncated_lmdb_is_an_error_naming_the_file_not_sigbus(lmdb_path, tmp_path):
    proc = subprocess.run([sys.executable, "-c", TRUNCATE, lmdb_path, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, f"died with {proc.returncode} (SIGBUS is -7): {proc.stderr[-2000:]}"
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["opened", f] for f in ("0.3", "0.5", "0.8", "0.95", "0.999")] \
        + [["reading", "LMDB"]], proc.stdout
    for line, name in zip(lines, ["cut0.3", "cut0.5", "cut0.8", "cut0.95", "cut0.999", "open"]):
        assert f"{os.path.join(str(tmp_path), name, 'data.mdb')} is truncated" in line, line
