"""The common "folder2lmdb" layout: pickled (bytes, label) under b'0'..., plus b'__keys__' and b'__len__'."""

import pickle

import numpy as np
import pytest
from conftest import jpeg_bytes, make_image

import fastload as fl

pytestmark = pytest.mark.needs("lmdb")
N = 12  # past 10, so key order (b'0', b'1', b'10', b'11', b'2', ...) differs from the listed order


def _write(path, images, extra=None, keys=None, length=None):
    import lmdb

    listed = [str(i).encode() for i in range(len(images))]
    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, img in zip(listed, images):
            txn.put(key, pickle.dumps((img, int(key) % 5)))
        txn.put(b"__keys__", pickle.dumps(listed if keys is None else keys))
        txn.put(b"__len__", pickle.dumps(len(listed) if length is None else length))
        for key, value in (extra or {}).items():
            txn.put(key, value)
    env.close()


@pytest.fixture(scope="module")
def images():
    return [jpeg_bytes(make_image(i, 20 + i, 30)) for i in range(N)]


def test_read_with_allow_pickle_in_the_listed_order(tmp_path, images):
    path = str(tmp_path / "f2l")
    _write(path, images)
    with pytest.raises(ValueError, match="allow_pickle=True"):
        fl.LMDBDataset(path)  # pickled: refused without the opt-in
    ds = fl.LMDBDataset(path, fl.transforms.eval(16), allow_pickle=True)
    assert len(ds) == N
    assert ds.labels.tolist() == [i % 5 for i in range(N)]
    assert [ds.read(i) for i in range(N)] == [(images[i], i % 5) for i in range(N)]
    assert ds.load(11)[0].shape == (16, 16, 3)
    with fl.Loader(ds, batch_size=4, num_workers=0, device="cpu", normalize=False, shuffle=False) as loader:
        assert [y for _, labels in loader for y in labels.tolist()] == [i % 5 for i in range(N)]


def test_a_lenient_parse_skips_the_bookkeeping_keys(tmp_path, images):
    path = str(tmp_path / "f2l")
    _write(path, images, extra={b"meta": b"not a sample"})

    def parse(value):  # reads anything: no pickle, a fixed label
        return bytes(value), 0

    assert len(fl.LMDBDataset(path, parse=parse, exclude_keys=[b"__keys__", "__len__", "meta"])) == N
    assert len(fl.LMDBDataset(path, parse=parse)) == N + 1  # defaults: folder2lmdb's two records only
    assert len(fl.LMDBDataset(path, parse=parse, exclude_keys=())) == N + 3
    with pytest.raises(TypeError, match="single key"):
        fl.LMDBDataset(path, parse=parse, exclude_keys="meta")
    with pytest.raises(TypeError, match="bytes or str"):
        fl.LMDBDataset(path, parse=parse, exclude_keys=[3])


def test_excluded_keys_and_a_bad_keys_record_are_named(tmp_path, images):
    path = str(tmp_path / "extra")
    _write(path, images, extra={b"zz-notes": pickle.dumps("a note")}, keys=None)
    ds = fl.LMDBDataset(path, allow_pickle=True)  # listed keys only: the note is never read
    assert len(ds) == N
    path = str(tmp_path / "nolist")
    _write(path, images, keys={"a": 1})
    with pytest.raises(ValueError, match=r"__keys__.* not a list of keys"):
        fl.LMDBDataset(path, allow_pickle=True)
    ds = fl.LMDBDataset(path, allow_pickle=True, exclude_keys=[b"__keys__", b"__len__"])  # every other key...
    assert len(ds) == N  # ...since explicit exclusions replace the __keys__ list
    path = str(tmp_path / "badlen")
    _write(path, images, length=N + 1)
    with pytest.raises(ValueError, match=r"__len__.* says 13 samples but .* lists 12"):
        fl.LMDBDataset(path, allow_pickle=True)
    path = str(tmp_path / "missing")
    _write(path, images, keys=[b"0", b"1", b"99"], length=3)
    with pytest.raises(ValueError, match=r"key b'99' listed in b'__keys__' is missing"):
        fl.LMDBDataset(path, allow_pickle=True)
    ds = fl.LMDBDataset(path, allow_pickle=True, exclude_keys=[b"__keys__", b"__len__"])
    assert np.array_equal(ds.labels, [int(k) % 5 for k in sorted(str(i).encode() for i in range(N))])  # key order
