import hashlib
import os
import subprocess
import sys
import zlib

import lmdb
import numpy as np
import pytest

import fastload as fl
from fastload.convert import convert

from conftest import write_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pairs(ds):
    """(sha1 of bytes, label) of every record, in order, read through fastload."""
    return [(hashlib.sha1(bytes(ds.read(i)[0])).hexdigest(), ds.read(i)[1]) for i in range(len(ds))]


def _loader_labels(ds):
    with fl.Loader(ds, batch_size=7, num_workers=0, device="cpu", normalize=False) as loader:
        return [y for _, labels in loader for y in labels.tolist()]


def test_folder_to_lmdb_round_trip(folder, tmp_path):
    dst = str(tmp_path / "out.lmdb")
    stats = convert(folder, dst, "lmdb", workers=2, verify_output=True, progress=False)
    src, back = fl.ImageFolder(folder), fl.LMDBDataset(dst, transform=fl.transforms.train(16))
    assert stats["records"] == len(src) and _pairs(back) == _pairs(src)
    assert back.classes == src.classes
    assert _loader_labels(back) == src.labels.tolist()


def test_folder_to_tfrecord_round_trip_in_tensorflow_layout(folder, tmp_path):
    dst = str(tmp_path / "tfr")
    convert(folder, dst, "tfrecord", shards=3, verify_output=True, progress=False)
    files = sorted(f for f in os.listdir(dst) if not f.endswith(".idx"))
    assert files == [f"data-0000{k}-of-00003" for k in range(3)]
    src, back = fl.ImageFolder(folder), fl.TFRecordDataset(os.path.join(dst, "data-*"), fl.transforms.train(16))
    assert _pairs(back) == _pairs(src)
    assert _loader_labels(back) == src.labels.tolist()
    from fastload.datasets.tfrecord_dataset import example_pb2

    with open(os.path.join(dst, files[0]), "rb") as f:
        f.seek(12)
        raw = f.read(int.from_bytes(open(os.path.join(dst, files[0]), "rb").read(8), "little"))
    feats = example_pb2().Example.FromString(raw).features.feature
    assert {"image/encoded", "image/class/label", "image/height", "image/width", "image/format",
            "image/class/synset", "image/filename"} <= set(feats)
    assert feats["image/class/synset"].bytes_list.value[0] == b"c0"


def test_lmdb_to_tfrecord_to_lmdb(folder, tmp_path):
    a, t, b = (str(tmp_path / n) for n in ("a.lmdb", "t", "b.lmdb"))
    convert(folder, a, "lmdb", progress=False)
    convert(a, t, "tfrecord", shards=2, progress=False)
    convert(t, b, "lmdb", verify_output=True, progress=False)
    assert _pairs(fl.LMDBDataset(b)) == _pairs(fl.LMDBDataset(a)) == _pairs(fl.ImageFolder(folder))


def test_reencode_shrinks_and_keeps_labels(folder, tmp_path):
    dst = str(tmp_path / "small.lmdb")
    convert(folder, dst, "lmdb", resize_shorter=48, quality=80, verify_output=True, progress=False)
    ds = fl.LMDBDataset(dst)
    img, label = ds.load(0)
    assert min(img.shape[:2]) == 48 and label == 0


def test_map_grows_from_a_tiny_start(folder, tmp_path, monkeypatch):
    from fastload import convert as conv

    monkeypatch.setattr(conv, "COMMIT_EVERY", 5)
    records = conv.read_all(fl.ImageFolder(folder), 1, None, None, "", False)
    conv.write_lmdb(records, str(tmp_path / "g.lmdb"), 24, None, map_size=32 * 1024)
    assert len(fl.LMDBDataset(str(tmp_path / "g.lmdb"))) == 24


def test_failure_leaves_nothing_that_looks_complete(tmp_path):
    src = write_folder(tmp_path / "src", num_classes=1, per_class=4)
    (tmp_path / "src" / "c0" / "002.jpg").write_bytes(b"\xff\xd8 broken")
    with pytest.raises(Exception):
        convert(src, str(tmp_path / "out.lmdb"), "lmdb", quality=80, progress=False)  # re-encode must decode
    assert os.listdir(tmp_path) == ["src"]


def test_verify_catches_a_changed_record(folder, tmp_path):
    from fastload.convert import verify
    from fastload.datasets.lmdb_dataset import close_env

    dst = str(tmp_path / "v.lmdb")
    convert(folder, dst, "lmdb", progress=False)
    ds = fl.ImageFolder(folder)
    crcs = np.array([zlib.crc32(ds.read(i)[0]) for i in range(len(ds))], np.uint32)
    labels = ds.labels.copy()
    verify(dst, crcs, labels, progress=False)
    labels[3] = 9
    with pytest.raises(ValueError, match="record 3 .* label 0, expected 9"):
        verify(dst, crcs, labels, progress=False)
    close_env(dst)  # fastload keeps one read environment per path and process
    env = lmdb.open(dst, map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"%09d" % 5, b"tampered")
    env.close()
    with pytest.raises(ValueError, match=r"record 5 .*\(checksum\)"):
        verify(dst, crcs, ds.labels, progress=False)


@pytest.mark.parametrize("tool,fmt", [("folder2lmdb.py", "lmdb"), ("folder2tfrecord.py", "tfrecord")])
def test_tools_run_from_a_checkout(folder, tmp_path, tool, fmt):
    dst = str(tmp_path / "out")
    args = [sys.executable, os.path.join(ROOT, "tools", tool), folder, dst, "--verify", "--workers", "2"]
    proc = subprocess.run(args + (["--shards", "2"] if fmt == "tfrecord" else []), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 24 records" in proc.stdout and "verified" in proc.stdout
    again = subprocess.run(args, capture_output=True, text=True)
    assert again.returncode == 2 and "exists; pass --overwrite" in again.stderr
