"""Tar headers read by hand: the members, offsets and sizes Python's tarfile sees, and bad
headers refused (naming the shard and byte) before a size from them is used."""

import io
import os
import tarfile

import numpy as np
import pytest

from fastload.datasets.webdataset import ShardError, expand_braces
from fastload.datasets.webdataset.index import group_members, load_index, save_index, split_name, ShardId
from fastload.datasets.webdataset.tar import BLOCK, Source, file_source, iter_members

from wds_servers import tar_offsets, write_shards


def _members(path):
    with open(path, "rb") as f:
        return [(m.name, m.offset, m.size) for m in iter_members(file_source(f), path, os.path.getsize(path))]


def _tar(members, fmt=tarfile.GNU_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _scan_bytes(raw, url="mem.tar", size=None):
    f = io.BytesIO(raw)
    return [(m.name, m.offset, m.size) for m in iter_members(Source(f.read), url, size)]


@pytest.mark.parametrize("writer", ["webdataset", "tar"])
def test_members_match_pythons_tarfile(tmp_path, writer):
    path = write_shards(tmp_path, [5], writer=writer)[0]
    want = tar_offsets(path)
    got = _members(path)
    assert {name: offset for name, offset, _ in got} == want
    with tarfile.open(path) as t:
        assert [(m.name, m.size) for m in t.getmembers() if m.isreg()] == [(n, s) for n, _, s in got]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_long_names_in_every_format(fmt):
    deep = "d" * 60 + "/" + "e" * 60 + "/"  # over 100 characters: a long name, PAX path or ustar prefix
    raw = _tar([(deep + "k1.jpg", b"x" * 700), (deep + "k1.cls", b"3"), ("k2.jpg", b"y")], fmt)
    names = [n for n, _, _ in _scan_bytes(raw)]
    assert names == [deep + "k1.jpg", deep + "k1.cls", "k2.jpg"]
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        assert [m.offset_data for m in t.getmembers()] == [o for _, o, _ in _scan_bytes(raw)]


def test_a_corrupt_header_names_the_shard_and_byte():
    raw = bytearray(_tar([("a.jpg", b"x" * 600), ("a.cls", b"1")]))
    second = BLOCK + 1024  # header, 600 bytes padded to 1024
    raw[second + 10] ^= 0xFF
    with pytest.raises(ShardError, match=rf"mem.tar: tar header checksum mismatch.*at byte {second}"):
        _scan_bytes(bytes(raw))


def test_sizes_from_headers_are_checked_before_use():
    raw = bytearray(_tar([("a.jpg", b"x" * 600)]))
    huge = b"%011o\0" % (1 << 33)
    raw[124:136] = huge  # the member now claims 8 GiB
    raw[148:156] = b"%06o\0 " % (sum(raw[:148]) + 256 + sum(raw[156:BLOCK]))
    with pytest.raises(ShardError, match=r"needs 8589934592 bytes from byte 512, but the shard has"):
        _scan_bytes(bytes(raw), size=len(raw))
    long_name = bytearray(_tar([("n" * 200 + ".jpg", b"x")], tarfile.GNU_FORMAT))
    long_name[124:136] = b"%011o\0" % (1 << 30)  # a 1 GiB "long name" must not be read into memory
    long_name[148:156] = b"%06o\0 " % (sum(long_name[:148]) + 256 + sum(long_name[156:BLOCK]))
    with pytest.raises(ShardError, match="a long name of 1073741824 bytes"):
        _scan_bytes(bytes(long_name))


def test_a_truncated_archive_is_an_error_at_its_end():
    raw = _tar([("a.jpg", b"x" * 600), ("a.cls", b"1")])
    with pytest.raises(ShardError, match="without its end-of-archive block"):
        _scan_bytes(raw[:BLOCK + 1024])
    with pytest.raises(ShardError, match="needs 600 bytes from byte 512, but the shard has 700"):
        _scan_bytes(raw[:700], size=700)


def test_grouping_by_key_and_a_broken_tail(tmp_path):
    raw = _tar([("__meta__", b"m"), ("a/b.c.d.JPG", b"1"), ("a/b.c.d.cls", b"2"), ("x.jpg", b"3"), ("x.cls", b"4")])
    assert split_name("a/b.c.d.JPG") == ("a/b", "c.d.jpg") and split_name("noext") is None
    index = group_members(iter_members(Source(io.BytesIO(raw).read), "u", None), "u")
    assert index.keys == ["a/b", "x"] and index.exts == ["c.d.jpg", "c.d.cls", "jpg", "cls"]
    assert index.member_sample.tolist() == [0, 0, 1, 1] and index.broken_offset == -1
    cut = raw[: tar_len_before(raw, "x.cls")]
    broken = group_members(iter_members(Source(io.BytesIO(cut).read), "u", None), "u")
    assert broken.keys == ["a/b", "x"] and broken.broken_offset >= 0 and "end-of-archive" in broken.broken
    dup = _tar([("k.jpg", b"1"), ("k.jpg", b"2")])
    with pytest.raises(ShardError, match="two members with extension 'jpg'"):
        group_members(iter_members(Source(io.BytesIO(dup).read), "u", None), "u")
    shard = ShardId("u", len(raw), "v1")
    save_index(str(tmp_path / "i.npz"), index, shard)
    again = load_index(str(tmp_path / "i.npz"), shard)
    assert again.keys == index.keys and np.array_equal(again.member_offset, index.member_offset)
    assert load_index(str(tmp_path / "i.npz"), ShardId("u", len(raw) - 1, "v1")) is None  # another size: stale


def tar_len_before(raw, name):
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        return next(m.offset for m in t.getmembers() if m.name == name)


def test_brace_expansion():
    assert expand_braces("s-{000..003}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"]
    assert expand_braces("{a,b}/{8..10}.tar") == ["a/8.tar", "a/9.tar", "a/10.tar", "b/8.tar", "b/9.tar", "b/10.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_braces("s-{0..3.tar")
