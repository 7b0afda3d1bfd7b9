import gzip
import os
import shutil
import struct
import warnings

import numpy as np
import pytest

import fastload as fl

from conftest import jpeg_bytes, make_image

pytestmark = pytest.mark.needs("tfrecord")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _write_with_tfrecord_package(path, n, label_base=0, extra=True):
    """Records written by the tfrecord package's own writer (as TensorFlow lays them out)."""
    from tfrecord.writer import TFRecordWriter

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
    monkeypatch.setattr(os, "access", lambda p, mode: False)
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
        got = [(r.image, r.label) for r in stream.records_for(0, 1)]
        assert got == [(images[i], i) for i in range(6)]
    assert fl.open_dataset(str(tmp_path / "a.tfrecord.gz")).__class__ is fl.TFRecordStream
    with pytest.raises(ValueError, match="compressed"):
        fl.TFRecordDataset(str(tmp_path / "a.tfrecord.gz"))


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


@pytest.mark.needs("lmdb")
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
        with fl.Loader(ds, batch_size=4, num_workers=workers, shuffle=True, normalize=False, device="cpu",
                       seed=0) as loader:
            outs.append([(x.clone(), y.clone()) for x, y in loader])
    for (a, la), (b, lb) in zip(*outs):
        assert np.array_equal(a.numpy(), b.numpy()) and la.tolist() == lb.tolist()


# --- Trust: descriptors, framing, shard sets, indexes --------------------------------

from tfrecord_files import framed, masked, tiny_jpeg, write_records  # noqa: E402


def test_descriptors_stay_bounded_under_a_low_ulimit(tmp_path):
    """300 shards read in a process allowed 200 descriptors (TensorFlow's 1024 shards vs ulimit 1024)."""
    import subprocess
    import sys

    for k in range(300):
        write_records(str(tmp_path / f"part-{k:05d}-of-00300"), [k], first_seed=k)
    code = (
        "import resource, sys, fastload as fl\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        f"ds = fl.TFRecordDataset({str(tmp_path)!r})\n"
        "for _ in range(2):\n"
        "    assert [ds.read(i)[1] for i in range(len(ds))] == list(range(300))\n"
        "import os; print(len(os.listdir('/proc/self/fd')))\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) < 150


def _open_files(ds) -> int:
    """Descriptors of this process open on the dataset's files (from /proc)."""
    files = {os.path.realpath(f) for f in ds.files}
    return sum(os.path.realpath(os.path.join("/proc/self/fd", fd)) in files for fd in os.listdir("/proc/self/fd"))


def test_descriptor_pool_is_shared_safely_by_threads(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    for k in range(20):
        write_records(str(tmp_path / f"f{k:02d}.tfrecord"), [k] * 3, first_seed=3 * k)
    ds = fl.TFRecordDataset(str(tmp_path), max_open_files=2)
    order = np.random.default_rng(0).permutation(np.tile(np.arange(len(ds)), 20))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: (i, ds.read(int(i))), order))
    assert all(image == tiny_jpeg(int(i)) and label == i // 3 for i, (image, label) in got)
    assert _open_files(ds) <= 2
    with pytest.raises(ValueError, match="max_open_files"):
        fl.TFRecordDataset(str(tmp_path), max_open_files=0)


def _corrupt_length(path, offset, length, keep_crc):
    raw = bytearray(open(path, "rb").read())
    head = struct.pack("<Q", length)
    raw[offset : offset + 8] = head
    if keep_crc:  # a length that passes its CRC but is larger than the file
        raw[offset + 8 : offset + 12] = struct.pack("<I", masked(head))
    open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize("length,keep_crc,problem", [
    (1 << 62, False, "length CRC mismatch at byte"),
    (1 << 40, True, "claims 1099511627776 bytes"),
    (5000, True, "truncated record at byte"),
])
def test_corrupt_length_is_checked_before_allocating(tmp_path, length, keep_crc, problem):
    path = str(tmp_path / "len.tfrecord")
    offsets = write_records(path, [0, 1, 2])
    _corrupt_length(path, offsets[1], length, keep_crc)
    with pytest.raises(ValueError, match=rf"len\.tfrecord: .*{problem}") as info:
        fl.TFRecordDataset(path)
    assert f"byte {offsets[1]}" in str(info.value)
    assert isinstance(info.value, fl.TFRecordError) and (info.value.path, info.value.offset) == (path, offsets[1])


def test_corrupt_length_in_gzip_is_checked_before_allocating(tmp_path):
    plain = str(tmp_path / "p")
    offsets = write_records(plain, [0, 1, 2])
    _corrupt_length(plain, offsets[1], 1 << 40, True)
    with open(plain, "rb") as src, gzip.open(str(tmp_path / "g.tfrecord.gz"), "wb") as dst:
        dst.write(src.read())
    with pytest.warns(RuntimeWarning, match="g.tfrecord.gz"):
        stream = fl.TFRecordStream(str(tmp_path / "g.tfrecord.gz"))
    records = list(stream.records_for(0, 1))
    assert [r.error is None for r in records] == [True, False]
    assert isinstance(records[1].error, fl.TFRecordError) and f"at byte {offsets[1]}" in records[1].where
    with pytest.raises(fl.TFRecordError, match=rf"g\.tfrecord\.gz: record at byte {offsets[1]} claims"):
        list(stream)


def test_incomplete_shard_set_is_refused_naming_the_missing(tmp_path):
    for k in range(3):
        write_records(str(tmp_path / f"train-{k:05d}-of-00008"), [k], first_seed=k)
    for path in (str(tmp_path), str(tmp_path / "train-*")):
        with pytest.raises(ValueError, match=r"5 of the 8 shards .* missing .*: train-00003-of-00008, "
                                             r"train-00004-of-00008, .* train-00007-of-00008"):
            fl.open_dataset(path)
        with pytest.raises(ValueError, match="train-00005-of-00008"):
            fl.TFRecordStream(path)
    subset = [str(tmp_path / f"train-{k:05d}-of-00008") for k in range(2)]
    assert len(fl.TFRecordDataset(subset)) == 2  # files named one by one: a subset on purpose


def test_empty_index_for_a_non_empty_file_is_rebuilt(tmp_path):
    path = str(tmp_path / "e.tfrecord")
    write_records(path, [0, 1, 2, 3])
    open(path + ".idx", "w").close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = fl.TFRecordDataset(path)
    assert len(ds) == 4 and [ds.read(i)[1] for i in range(4)] == [0, 1, 2, 3]
    assert "stale TFRecord index" in str(caught[0].message)
    assert len(open(path + ".idx").read().splitlines()) == 4


def test_index_of_a_rewritten_file_is_rebuilt(tmp_path):
    path = str(tmp_path / "r.tfrecord")
    write_records(path, [0, 1, 2])
    fl.TFRecordDataset(path)
    write_records(path, [5, 6, 7, 8, 9], first_seed=50)  # replaced; its old index stays
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = fl.TFRecordDataset(path)
    assert [ds.read(i) for i in range(len(ds))] == [(tiny_jpeg(50 + k), 5 + k) for k in range(5)]
    assert "r.tfrecord.idx (the records end at byte" in str(caught[0].message)


def test_stale_index_in_a_read_only_folder_is_rebuilt_in_the_cache(tmp_path, monkeypatch):
    path = str(tmp_path / "ro.tfrecord")
    write_records(path, [0, 1])
    open(path + ".idx", "w").write("0 999\n")
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = fl.TFRecordDataset(path, index_dir=str(tmp_path / "cache"))
    assert len(ds) == 2 and [ds.read(i)[1] for i in range(2)] == [0, 1]
    assert open(path + ".idx").read() == "0 999\n" and "stale" in str(caught[0].message)
    assert len(os.listdir(tmp_path / "cache")) == 1
    assert len(fl.TFRecordDataset(path, index_dir=str(tmp_path / "cache"))) == 2  # the cached one is valid


def test_record_that_disagrees_with_its_index_is_named(tmp_path):
    path = str(tmp_path / "d.tfrecord")
    offsets = write_records(path, [0, 1, 2])
    ds = fl.TFRecordDataset(path)
    raw = bytearray(open(path, "rb").read())  # swap in a record of another length, same file size
    one = framed(b"x" * (offsets[2] - offsets[1] - 16 - 20))
    raw[offsets[1] : offsets[2]] = one + framed(b"y" * 4)
    st = os.stat(path)
    open(path, "wb").write(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the file's stamp as indexed: only its records tell
    with pytest.raises(ValueError, match=rf"record at byte {offsets[1]} holds .* index says .*stale"):
        ds.read(1)


def test_sidecar_counts_catch_a_shard_cut_at_a_record_boundary(tmp_path, folder):
    from fastload.convert import convert

    dst = str(tmp_path / "t")
    convert(folder, dst, "tfrecord", shards=2, progress=False)
    shard = os.path.join(dst, "data-00001-of-00002")
    offsets = [int(line.split()[0]) for line in open(shard + ".idx")]
    with open(shard, "r+b") as f:
        f.truncate(offsets[-1])
    with pytest.raises(ValueError, match=r"data-00001-of-00002: 11 records, but the dataset's metadata sidecar "
                                         r"says 12"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the index is stale too, and rebuilt
            fl.open_dataset(dst)


def test_forked_child_reopens_its_own_descriptors(tmp_path):
    for k in range(4):
        write_records(str(tmp_path / f"f{k}.tfrecord"), [k], first_seed=k)
    ds = fl.TFRecordDataset(str(tmp_path), max_open_files=2)
    assert [ds.read(i)[1] for i in range(4)] == [0, 1, 2, 3] and _open_files(ds) == 2
    pid = os.fork()
    if pid == 0:  # the child: inherited descriptors are dropped, reads open their own
        ok = _open_files(ds) == 0 and [ds.read(i)[1] for i in (3, 0, 2, 1)] == [3, 0, 2, 1]
        os._exit(0 if ok and _open_files(ds) == 2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [ds.read(i)[1] for i in range(4)] == [0, 1, 2, 3]


def test_a_file_replaced_after_indexing_is_an_error_where_it_is_opened_again(tmp_path):
    # A user review: a TFRecord folder converted anew under an open TFRecordDataset was read with
    # the old index by worker processes (which open the files again): every label wrong, no
    # error, while num_workers=0 read the old file. Where a file is opened again, it must be the
    # one indexed.
    path = str(tmp_path / "a.tfrecord")
    write_records(path, range(8))
    ds = fl.TFRecordDataset(path, transform=fl.transforms.eval(8, resize=8))
    assert ds.read(0)[1] == 0  # this process has the file open: it goes on reading the one indexed
    replacement = str(tmp_path / "new.tfrecord")
    write_records(replacement, range(10, 18))
    os.replace(replacement, path)
    assert ds.read(1)[1] == 1
    with fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", normalize=False) as loader:
        with pytest.raises(fl.SampleError, match="a.tfrecord: the file changed since the dataset indexed it"):
            list(loader)
    ds._pool.close()  # closed (as after more files than max_open_files): opened again
    with pytest.raises(fl.TFRecordError, match="the file changed since the dataset indexed it"):
        ds.read(2)
