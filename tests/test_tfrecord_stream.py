"""TFRecordStream's slot contract: equal lengths, each record read once, errors as records."""

import gzip
import io
import os
import warnings

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.datasets.tfrecord import stream as stream_module
from fastload.datasets.tfrecord.slots import Segment, plan_slots

from tfrecord_files import tiny_jpeg, write_records, write_shards

pytestmark = pytest.mark.needs("tfrecord")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _files(tmp_path, sizes, gz=False):
    return write_shards(tmp_path / "data", sizes, gz)


def _slots(stream, num_slots, drop_last=False):
    return [list(stream.records_for(s, num_slots, drop_last=drop_last)) for s in range(num_slots)]


class _Counting(io.RawIOBase):
    """A file that counts the bytes read through it."""

    def __init__(self, f, tally):
        self.f, self.tally = f, tally

    def read(self, n=-1):
        data = self.f.read(n)
        self.tally["bytes"] += len(data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, *args):
        return self.f.seek(*args)

    def tell(self):
        return self.f.tell()

    def readable(self):
        return True

    def seekable(self):
        return True

    def close(self):
        self.f.close()
        super().close()


def _count_reads(monkeypatch):
    tally = {"bytes": 0, "opens": []}
    real = stream_module.open_file

    def counting(path, gz):
        tally["opens"].append(os.path.basename(path))
        return _Counting(real(path, gz), tally)

    monkeypatch.setattr(stream_module, "open_file", counting)
    return tally


@pytest.mark.parametrize("gz", [False, True])
def test_25_records_over_4_slots_give_equal_batch_counts(tmp_path, gz):
    stream = fl.TFRecordStream(_files(tmp_path, [7, 6, 5, 4, 3], gz))
    for drop_last in (False, True):
        slots = _slots(stream, 4, drop_last)
        assert [len(s) for s in slots] == [stream.slot_length(4, drop_last=drop_last)] * 4
        batches = [-(-len(s) // 3) for s in slots]  # batch 3, keeping the last partial batch
        assert len(set(batches)) == 1
        numbers = sorted({r.number for s in slots for r in s})
        if drop_last:
            assert len(numbers) == 4 * stream.slot_length(4, drop_last=True)
        else:
            assert numbers == list(range(25))  # every record, the rest are repeats within a slot
        for s in slots:
            assert all(r.error is None and r.label == r.number and r.image == tiny_jpeg(r.number) for r in s)


def test_padding_repeats_a_slots_own_records_and_drop_last_truncates(tmp_path):
    stream = fl.TFRecordStream(_files(tmp_path, [25]))
    assert stream.slot_length(4) == 7 and stream.slot_length(4, drop_last=True) == 6
    slots = _slots(stream, 4)
    assert [[r.number for r in s] for s in slots] == [
        [0, 1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 11, 6], [12, 13, 14, 15, 16, 17, 12], list(range(18, 25))]
    assert [[r.number for r in s] for s in _slots(stream, 4, drop_last=True)] == [
        list(range(0, 6)), list(range(6, 12)), list(range(12, 18)), list(range(18, 24))]


def test_plain_records_are_read_once_across_slots(tmp_path, monkeypatch):
    root = _files(tmp_path, [10, 9, 5])  # 24 records: 6 per slot, no padding
    stream = fl.TFRecordStream(root)
    tally = _count_reads(monkeypatch)
    numbers = [r.number for s in _slots(stream, 4) for r in s]
    assert sorted(numbers) == list(range(24))
    data = sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root) if not f.endswith(".idx"))
    assert tally["bytes"] == data  # every byte of every file read once, by one slot


def test_gzip_files_are_decompressed_once_across_slots(tmp_path, monkeypatch):
    root = _files(tmp_path, [6, 6, 6, 6, 6, 6, 6, 6], gz=True)
    stream = fl.TFRecordStream(root)
    tally = _count_reads(monkeypatch)
    slots = _slots(stream, 4)
    assert sorted(r.number for s in slots for r in s) == list(range(48))
    assert sorted(tally["opens"]) == sorted(f for f in os.listdir(root))  # each file opened by one slot
    raw = sum(len(gzip.open(os.path.join(root, f)).read()) for f in os.listdir(root))
    assert tally["bytes"] == raw


def test_gzip_counts_are_cached(tmp_path, monkeypatch):
    root = _files(tmp_path, [3, 4], gz=True)
    assert len(fl.TFRecordStream(root)) == 7
    tally = _count_reads(monkeypatch)
    assert len(fl.TFRecordStream(root)) == 7 and tally["opens"] == []


def test_fewer_gzip_files_than_slots_still_splits_evenly(tmp_path):
    stream = fl.TFRecordStream(_files(tmp_path, [10, 10], gz=True))
    with pytest.warns(RuntimeWarning, match="split between 4 slots"):
        slots = _slots(stream, 4)
    assert [len(s) for s in slots] == [5, 5, 5, 5]
    assert sorted(r.number for s in slots for r in s) == list(range(20))


@pytest.mark.filterwarnings("ignore:.*split between")
@pytest.mark.parametrize("gz", [False, True])
def test_one_flipped_byte_errors_exactly_that_record(tmp_path, gz):
    path = str(tmp_path / "big.tfrecord")
    offsets = write_records(path, range(300))
    raw = bytearray(open(path, "rb").read())
    raw[offsets[123] + 40] ^= 0xFF  # inside record 123's data
    if gz:
        os.remove(path)
        path += ".gz"
        with gzip.open(path, "wb") as f:
            f.write(bytes(raw))
    else:
        open(path, "wb").write(bytes(raw))
    stream = fl.TFRecordStream(path)
    records = [r for s in _slots(stream, 3) for r in s]
    bad = [r for r in records if r.error is not None]
    assert [r.number for r in bad] == [123] and bad[0].image is None
    assert "data CRC mismatch" in str(bad[0].error) and bad[0].where == f"{path} record at byte {offsets[123]}"
    assert sorted(r.number for r in records if r.error is None) == [n for n in range(300) if n != 123]
    with pytest.raises(fl.TFRecordError, match="data CRC mismatch"):
        list(stream)


def test_broken_length_in_a_plain_file_resyncs_from_its_index(tmp_path):
    path = str(tmp_path / "p.tfrecord")
    offsets = write_records(path, range(10))
    stream = fl.TFRecordStream(path)  # builds the index while the file is intact
    raw = bytearray(open(path, "rb").read())
    raw[offsets[4] + 3] ^= 0x01  # the length of record 4: same file size, so the index still fits
    open(path, "wb").write(bytes(raw))
    records = list(stream.records_for(0, 1))
    assert [r.number for r in records] == list(range(10))
    assert [r.number for r in records if r.error] == [4] and "length CRC mismatch" in str(records[4].error)


def test_broken_length_in_gzip_turns_the_rest_of_the_file_into_error_records(tmp_path):
    root = _files(tmp_path, [6, 6], gz=True)
    stream = fl.TFRecordStream(root)  # counts cached while intact
    path = os.path.join(root, "part-00000-of-00002.gz")
    raw = bytearray(gzip.open(path).read())
    offsets = write_records(str(tmp_path / "scratch"), range(6))
    raw[offsets[2] + 3] ^= 0x01  # the stream keeps the counts it took while the file was intact
    with gzip.open(path, "wb") as f:
        f.write(bytes(raw))
    slots = _slots(stream, 2)
    assert [len(s) for s in slots] == [6, 6]
    errors = [r for r in slots[0] if r.error]
    assert [r.number for r in errors] == [2, 3, 4, 5]
    assert errors[0].where.endswith(f"record at byte {offsets[2]}") and errors[1].where == f"record 3 of {path}"
    assert all(r.error is None for r in slots[1])


def test_file_broken_before_counting_gives_one_error_record(tmp_path):
    path = str(tmp_path / "b.tfrecord")
    offsets = write_records(path, range(5))
    raw = bytearray(open(path, "rb").read())
    raw[offsets[3] + 3] ^= 0x01
    open(path, "wb").write(bytes(raw))
    with pytest.warns(RuntimeWarning, match=f"length CRC mismatch at byte {offsets[3]}"):
        stream = fl.TFRecordStream(path)
    assert len(stream) == 4
    records = list(stream.records_for(0, 1))
    assert [r.error is None for r in records] == [True, True, True, False]


def test_missing_feature_is_an_error_record(tmp_path):
    path = str(tmp_path / "k.tfrecord")
    write_records(path, range(3))
    records = list(fl.TFRecordStream(path, image_key="image/jpeg").records_for(0, 1))
    assert all(isinstance(r.error, KeyError) and "image/jpeg" in str(r.error) for r in records)


def test_decode_uses_the_records_number_and_names_it(tmp_path, folder):
    from fastload.convert import convert

    convert(folder, str(tmp_path / "t"), "tfrecord", shards=2, progress=False)
    stream = fl.TFRecordStream(str(tmp_path / "t"), transform=fl.transforms.train(16))
    assert stream.classes == ["c0", "c1", "c2"]
    a = {r.number: r for r in stream.records_for(0, 2)}
    b = {r.number: r for r in stream.records_for(1, 2)}
    assert sorted({**a, **b}) == list(range(24))
    ds = fl.TFRecordDataset(str(tmp_path / "t"), transform=fl.transforms.train(16))
    for n, record in {**a, **b}.items():  # the same augmentation as the map-style dataset's sample n
        assert np.array_equal(stream.decode(record, 3, 7), ds.load(n, 3, 7)[0])
    bad = fl.StreamRecord(5, "somewhere record at byte 9", b"not an image", 0)
    with pytest.raises(fl.DecodeError, match="record 5 \\(somewhere record at byte 9\\)"):
        stream.decode(bad, 0, 0)


def test_slot_arguments_are_checked(tmp_path):
    stream = fl.TFRecordStream(_files(tmp_path, [3]))
    with pytest.raises(ValueError, match="slot 4 must be in"):
        stream.records_for(4, 4)
    with pytest.raises(TypeError, match="num_slots"):
        stream.slot_length(2.0)
    with pytest.raises(ValueError, match="3 records cannot fill 4 slots"):
        stream.slot_length(4)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        stream.records_for(0, 2, batch_size=0)
    with pytest.raises(TypeError, match="batch_size must be an int, got 2.0"):
        stream.records_for(0, 2, batch_size=2.0)
    # one rank pads nothing: 3 records, batch 2, 4 workers: batches [0, 1] and [2], two workers idle
    assert [[r.number for r in stream.records_for(s, 4, batch_size=2)] for s in range(4)] == [[0, 1], [2], [], []]
    assert not hasattr(stream, "shard") and not hasattr(stream, "set_epoch") and not hasattr(stream, "seed")


def test_standalone_iteration_yields_all_decoded(tmp_path):
    stream = fl.TFRecordStream(_files(tmp_path, [2, 3]))
    got = list(stream)
    assert [label for _, label in got] == list(range(5)) and got[0][0].shape == (8, 8, 3)


def test_plans_cover_every_record_once():
    for counts, seekable, slots in (([7, 6, 5, 4, 3], [False] * 5, 4), ([10, 0, 3], [True] * 3, 4),
                                    ([5, 5], [False, False], 3), ([9, 1, 1, 1], [False, True, True, True], 2)):
        plan = plan_slots(counts, seekable, slots)
        covered = sorted((s.file_id, k) for segs in plan for s in segs for k in range(s.start, s.stop))
        assert covered == [(f, k) for f, n in enumerate(counts) for k in range(n)]
    assert plan_slots([7, 6, 5, 4, 3], [False] * 5, 4) == [
        [Segment(0, 0, 7)], [Segment(1, 0, 6)], [Segment(2, 0, 5)], [Segment(3, 0, 4), Segment(4, 0, 3)]]


class _Slots(torch.utils.data.IterableDataset):
    """The batch-source contract in miniature: each worker reads its own slot."""

    def __init__(self, stream, rank, world_size):
        self.stream, self.rank, self.world_size = stream, rank, world_size

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        slot = self.rank * info.num_workers + info.id
        for record in self.stream.records_for(slot, self.world_size * info.num_workers):
            yield record.number, int(self.stream.decode(record, 1, 0).sum())


def test_slots_read_in_worker_processes_after_pickling(tmp_path):
    import pickle

    stream = pickle.loads(pickle.dumps(fl.TFRecordStream(_files(tmp_path, [5, 6, 7, 6], gz=True))))
    seen = []
    for rank in range(2):
        loader = torch.utils.data.DataLoader(_Slots(stream, rank, 2), batch_size=None, num_workers=2,
                                             multiprocessing_context="fork")
        seen.extend(number for number, _ in loader)
    assert sorted(set(seen)) == list(range(24)) and len(seen) == 4 * stream.slot_length(4)  # 7: padded


def test_one_rank_splits_whole_batches_and_warns_of_split_gzip_only_where_more_shards_help(tmp_path):
    stream = fl.TFRecordStream(write_shards(tmp_path / "three", [5, 5, 5], gz=True) + "/part-*")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # three files for three workers: a prefix each at most, no warning
        runs = [[r.number for r in stream.records_for(s, 3, batch_size=4)] for s in range(3)]
    assert runs == [list(range(0, 7)), list(range(7, 11)), list(range(11, 15))]  # batches 0 and 3 (short), 1, 2
    one = fl.TFRecordStream(write_shards(tmp_path / "one", [15], gz=True) + "/part-*")
    with pytest.warns(RuntimeWarning, match="1 GZIP file.*split between 2 slots"):
        assert [r.number for r in one.records_for(1, 2, batch_size=4)] == list(range(8, 15))
