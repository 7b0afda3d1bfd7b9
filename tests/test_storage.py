import pickle

import numpy as np
import pytest
import torch.multiprocessing as mp

from fastload.datasets.storage import SharedArray, StringArray


def test_string_array_round_trip():
    items = ["a/b.jpg", "", "ünïcødé/ß.png", "x" * 1000]
    s = StringArray(items)
    assert len(s) == 4
    assert list(s) == items
    assert s[-1] == items[-1]
    assert s.get_bytes(2) == items[2].encode()
    assert s.offsets[-1] == len(s.data) == sum(len(i.encode()) for i in items)
    with pytest.raises(IndexError, match="index 4 out of range"):
        s[4]


def test_undecodable_path_bytes_survive():
    raw = b"caf\xe9.jpg"  # latin-1 name on a UTF-8 file system
    s = StringArray([raw.decode("utf-8", "surrogateescape")])
    assert s.get_bytes(0) == raw


def test_arrays_are_read_only_and_shared():
    a = SharedArray(np.arange(5))
    assert a.array.dtype == np.int64 and list(a.array) == [0, 1, 2, 3, 4]
    assert a._tensor.is_shared()
    with pytest.raises(ValueError):
        a.array[0] = 7


def test_plain_pickle_keeps_values():
    s = StringArray(["one", "two"])
    back = pickle.loads(pickle.dumps(s))
    assert list(back) == ["one", "two"]


def test_from_buffer_validates_offsets():
    data = np.frombuffer(b"abcd", dtype=np.uint8)
    assert list(StringArray.from_buffer(data, [0, 1, 4])) == ["a", "bcd"]
    with pytest.raises(ValueError, match="end at len"):
        StringArray.from_buffer(data, [0, 1, 3])
    with pytest.raises(ValueError, match="start at 0"):
        StringArray.from_buffer(data, [1, 4])


def _child(queue, strings, labels):
    queue.put((list(strings), labels.array.tolist(), strings._data._tensor.is_shared()))


def test_spawn_child_maps_the_same_shared_memory():
    ctx = mp.get_context("spawn")
    strings, labels = StringArray(["p0", "p1", "p2"]), SharedArray([3, 1, 2])
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, strings, labels))
    proc.start()
    got = queue.get(timeout=60)
    proc.join(60)
    assert got[0] == ["p0", "p1", "p2"] and got[1] == [3, 1, 2]
    assert got[2], "the child received a copy instead of shared memory"
