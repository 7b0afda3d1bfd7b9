import gzip
import os
import shutil

import numpy as np
import pytest
from tfrecord.writer import TFRecordWriter

import fastload as fl
from fastload.datasets import tfrecord_dataset as tfr

from conftest import jpeg_bytes, make_image


def _write_with_tfrecord_package(path, n, label_base=0, extra=True):
    """Records written by the tfrecord package's own writer (as TensorFlow lays them out)."""
    writer = TFRecordWriter(path)
    images = []
    for i in range(n):
        img = jpeg_bytes(make_image(100 + i, 24, 32))
        images.append(img)
        fields = {"image/encoded": (img, "byte"), "image/class/label": (i + label_base, "int")}
        if extra:
            fields.update({"image/height": (24, "int"), "image/width": (32, "int"),
                           "image/format": (b"JPEG", "byte")})
        writer.write(fields)
    writer.close()
    return images


def test_reads_tfrecord_package_files_and_builds_index(tmp_path):
    path = str(tmp_path / "train.tfrecord")
    images = _write_with_tfrecord_package(path, 5, label_base=1)
    ds = fl.TFRecordDataset(path, label_offset=-1)  # TensorFlow's ImageNet labels start at 1
    assert os.path.exists(path + ".idx") and len(ds) == 5
    assert [ds.read(i) for i in range(5)] == [(images[i], i) for i in range(5)]
    assert ds.labels.tolist() == [0, 1, 2, 3, 4]
    # The index we built matches the tfrecord package's own tool.
    from tfrecord.tools.tfrecord2idx import create_index

    create_index(path, str(tmp_path / "theirs.idx"))
    assert open(path + ".idx").read() == open(tmp_path / "theirs.idx").read()


def test_read_only_data_dir_puts_index_in_cache(tmp_path, monkeypatch):
    path = str(tmp_path / "ro.tfrecord")
    _write_with_tfrecord_package(path, 3)
    monkeypatch.setattr(tfr.os, "access", lambda p, mode: False)
    ds = fl.TFRecordDataset(path, index_dir=str(tmp_path / "cache"))
    assert not os.path.exists(path + ".idx")
    assert len(os.listdir(tmp_path / "cache")) == 1 and len(ds) == 3


def test_gzip_and_plain_streams(tmp_path):
    plain = str(tmp_path / "a.tfrecord")
    images = _write_with_tfrecord_package(plain, 6)
    with open(plain, "rb") as src, gzip.open(str(tmp_path / "a.tfrecord.gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    for path in (plain, str(tmp_path / "a.tfrecord.gz")):
        stream = fl.TFRecordStream(path)
        got = [(image, label) for _, _, _, image, label in stream.records()]
        assert got == [(images[i], i) for i in range(6)]
    assert fl.open_dataset(str(tmp_path / "a.tfrecord.gz")).__class__ is fl.TFRecordStream
    with pytest.raises(ValueError, match="compressed"):
        fl.TFRecordDataset(str(tmp_path / "a.tfrecord.gz"))


def test_stream_exactly_once_across_two_ranks_and_two_workers(tmp_path):
    for k in range(3):
        _write_with_tfrecord_package(str(tmp_path / f"part{k}.tfrecord"), 7, label_base=k * 7)
    seen = []
    for rank in range(2):
        stream = fl.TFRecordStream(str(tmp_path / "part*.tfrecord"), transform=fl.transforms.train(8))
        with fl.Loader(stream, batch_size=3, num_workers=2, rank=rank, world_size=2, device="cpu") as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                labels = [y for _, b in loader for y in b.tolist()]
                if epoch == 0:
                    seen.extend(labels)
    assert sorted(seen) == list(range(21))


def test_crc_and_truncation_errors_name_file_and_offset(tmp_path):
    path = str(tmp_path / "c.tfrecord")
    _write_with_tfrecord_package(path, 3)
    ds = fl.TFRecordDataset(path)
    second = int(ds._offsets.array[1])
    raw = bytearray(open(path, "rb").read())
    raw[second + 40] ^= 0xFF  # flip a byte inside record 1's data
    open(path, "wb").write(bytes(raw))
    with pytest.raises(ValueError, match=rf"c\.tfrecord: data CRC mismatch in record at byte {second}"):
        fl.TFRecordDataset(path).read(1)
    assert fl.TFRecordDataset(path, check_crc=False).read(0)[1] == 0  # opt-out for speed
    open(path, "wb").write(bytes(raw[: second + 30]))
    os.remove(path + ".idx")
    with pytest.raises(ValueError, match=rf"truncated record at byte {second}"):
        fl.TFRecordDataset(path)


def test_missing_feature_lists_what_the_record_has(tmp_path):
    path = str(tmp_path / "k.tfrecord")
    _write_with_tfrecord_package(path, 2)
    ds = fl.TFRecordDataset(path, image_key="image/jpeg")
    with pytest.raises(KeyError, match=r"'image/jpeg' not in record; it has \['image/class/label', 'image/encoded'"):
        ds.read(0)


def test_open_dataset_recognises_every_kind(tmp_path, folder):
    from fastload.convert import convert

    lst = tmp_path / "list.txt"
    lst.write_text("c0/000.jpg 0\n")
    tfr_file = str(tmp_path / "one.tfrecord")
    _write_with_tfrecord_package(tfr_file, 2)
    convert(folder, str(tmp_path / "x.lmdb"), "lmdb", progress=False)
    assert type(fl.open_dataset(folder)) is fl.ImageFolder
    assert type(fl.open_dataset(str(lst), root=folder)) is fl.ImageList
    assert type(fl.open_dataset(tfr_file)) is fl.TFRecordDataset
    assert type(fl.open_dataset(str(tmp_path / "*.tfrecord"))) is fl.TFRecordDataset
    assert type(fl.open_dataset(str(tmp_path / "x.lmdb"))) is fl.LMDBDataset
    with pytest.raises(FileNotFoundError, match="missing"):
        fl.open_dataset(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not an image folder"):
        fl.open_dataset(str(tmp_path / "empty"))


def test_map_style_with_workers_matches_single_process(tmp_path):
    path = str(tmp_path / "w.tfrecord")
    _write_with_tfrecord_package(path, 9)
    ds = fl.TFRecordDataset(path, transform=fl.transforms.train(8))
    outs = []
    for workers in (0, 2):
        with fl.Loader(ds, batch_size=4, num_workers=workers, shuffle=True, normalize=False, device="cpu") as loader:
            outs.append([(x.clone(), y.clone()) for x, y in loader])
    for (a, la), (b, lb) in zip(*outs):
        assert np.array_equal(a.numpy(), b.numpy()) and la.tolist() == lb.tolist()
