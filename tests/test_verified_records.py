"""Converters verify and record for TFRecord and WebDataset (the sidecar's ``verified`` section),
and TFRecordDataset, TFRecordStream and WebDataset use it: matching bytes may take the cheap
plan, changed bytes are refused every epoch, naming shard and offset (issue 39)."""

import contextlib
import json
import warnings

import pytest
from conftest import photo_jpegs
from test_verified import ROI, _damaged

import fastload as fl
from fastload.convert import main as convert_main
from fastload.datasets.tfrecord.framing import mask, stored_crc
from fastload.decode import DecodeError, costs, plan
from fastload.verified import NOT_VERIFIED, ChangedSinceVerifiedError, crc32c

FORMATS = ("tfrecord", "wds")
SIDECAR = {"tfrecord": "data.fastload.json", "wds": "shard.fastload.json"}
CROP = dict(scale=(0.05, 0.5))


@pytest.fixture(autouse=True)
def _private_cache(out, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(out / "xdg-cache"))


@pytest.fixture
def photo_folder(tmp_path):
    """root/c0, root/c1: 12 photos (JPEG, 300-500 pixels on the shorter side)."""
    for i, blob in enumerate(photo_jpegs((300, 500), 2, seed=7)[:12]):
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        (tmp_path / f"c{i % 2}" / f"{i:02d}.jpg").write_bytes(blob)
    return tmp_path


@pytest.fixture
def region_wanted(monkeypatch):
    """The process planner from costs where a region decode costs nothing (as in test_verified.py)."""
    free = {**costs.DEFAULT_COSTS, "decode": {**costs.DEFAULT_COSTS["decode"], "region": [0.0, 0.0, 0.0]}}
    monkeypatch.setattr(plan, "DEFAULT_COSTS", free)
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    monkeypatch.delenv("FASTLOAD_ROI", raising=False)
    plan.set_planner(None)
    yield free
    plan.set_planner(None)


@pytest.fixture
def out(tmp_path_factory):
    """A folder for the outputs (photo_folder is tmp_path: anything there would be a class)."""
    return tmp_path_factory.mktemp("out")


def _convert(fmt, src, dst, *extra):
    args = ["--shards", "2"] if fmt == "tfrecord" else ["--shard-samples", "5"]
    convert_main(fmt, [str(src), str(dst), "--workers", "2", *args, *extra])


def _open(kind, dst, **kwargs):
    transform = fl.transforms.train(48, **CROP)
    if kind == "TFRecordDataset":
        return fl.TFRecordDataset(str(dst), transform, **kwargs)
    if kind == "TFRecordStream":
        return fl.TFRecordStream(str(dst), transform, **kwargs)
    return fl.WebDataset(str(dst), transform, **kwargs)


def _kind_dst(kind, out, photo_folder):
    fmt = "wds" if kind == "WebDataset" else "tfrecord"
    dst = out / f"out-{fmt}"
    _convert(fmt, photo_folder, dst, "--verify")
    return dst


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_converter_with_verify_records_each_records_checksum_and_who_verified(photo_folder, out, fmt):
    dst = out / "out"
    _convert(fmt, photo_folder, dst, "--verify")
    section = json.loads((dst / SIDECAR[fmt]).read_text())["verified"]
    assert section["by"].startswith(f"fastload {fl.__version__}, strict, ") and section["strict"] is True
    assert section["checksum"] == "crc32c"
    crcs = [c for shard in sorted(section["records"]) for c in section["records"][shard]]
    assert len(crcs) == 12 and NOT_VERIFIED not in crcs
    if fmt == "tfrecord":  # the CRC32C of each record's data: what its frame holds, masked
        ds = fl.TFRecordDataset(str(dst))
        for i in range(len(ds)):
            path, offset, length = ds.files[int(ds._file_ids.array[i])], ds._offsets.array[i], ds._lengths.array[i]
            with open(path, "rb") as f:
                f.seek(offset)
                framed = f.read(length)
            assert mask(crcs[i]) == stored_crc(framed) and ds.verified_checksum(i) == crcs[i]
    else:  # the CRC32C of each image member, in the shard's order
        ds = fl.WebDataset(str(dst))
        assert [crc32c(ds.read(i)[0]) for i in range(len(ds))] == crcs
    assert ds.verified_count == 12 and ds.verified_by == section["by"]
    plain = out / "plain"
    _convert(fmt, photo_folder, plain)
    assert "verified" not in json.loads((plain / SIDECAR[fmt]).read_text())
    assert (fl.TFRecordDataset if fmt == "tfrecord" else fl.WebDataset)(str(plain)).verified_count == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_damaged_jpeg_given_to_the_converter_with_verify_is_refused_naming_it(photo_folder, out, fmt, capsys):
    bad = photo_folder / "c1" / "bad-flip.jpg"
    bad.write_bytes(_damaged((photo_folder / "c0" / "00.jpg").read_bytes()))
    dst = out / "out"
    with pytest.raises(SystemExit) as exited:
        _convert(fmt, photo_folder, dst, "--verify")
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "1 of 13 records failed" in err and "does not decode strictly" in err and str(bad) in err, err
    section = json.loads((dst / SIDECAR[fmt]).read_text())["verified"]
    crcs = [c for shard in sorted(section["records"]) for c in section["records"][shard]]
    assert crcs.count(NOT_VERIFIED) == 1 and len(crcs) == 13  # written, left unverified: decoded strictly


@ROI
@pytest.mark.parametrize("kind", ["TFRecordDataset", "TFRecordStream", "WebDataset"])
def test_verified_records_are_planned_the_cheap_way(photo_folder, out, region_wanted, kind):
    dst = _kind_dst(kind, out, photo_folder)

    def plans(ds):
        if kind == "TFRecordDataset":
            return [ds.plan(i) for i in range(len(ds))]
        return [ds.plan_record(r, 0, 0) for r in ds.records_for(0, 1)]

    verified = plans(_open(kind, dst))
    assert all(p.verified for p in verified)
    assert sum(p.steps.plan.kind == "region" for p in verified) >= 8
    strict = plans(_open(kind, dst, verified=False))
    assert not any(p.verified for p in strict) and all(p.steps.plan.kind != "region" for p in strict)
    with pytest.raises(TypeError, match="verified must be True or False, got 'yes'"):
        _open(kind, dst, verified="yes")


def _flip_image(kind, ds, index):
    """Damages the image of sample ``index`` in place in its shard file (same length); returns
    the shard's path."""
    data = bytes(ds.read(index)[0])
    if kind == "WebDataset":
        shard = ds.table.shards[int(ds.table.shard.array[index])].url
    else:
        shard = ds.files[int(ds._file_ids.array[index])]
    with open(shard, "rb") as f:
        blob = f.read()
    at = blob.index(data)
    with open(shard, "r+b") as f:
        f.seek(at)
        f.write(_damaged(data))
    return shard


CASES = [
    ("TFRecordDataset", dict(num_workers=0)),
    ("TFRecordDataset", dict(num_workers=2)),
    ("TFRecordDataset", dict(num_workers=2, backend="thread")),
    ("TFRecordStream", dict(num_workers=0)),
    ("TFRecordStream", dict(num_workers=2)),
    ("WebDataset", dict(num_workers=0)),
    ("WebDataset", dict(num_workers=2)),
]


@pytest.mark.parametrize(("kind", "options"), CASES, ids=[f"{k}-{o}" for k, o in CASES])
def test_a_record_changed_since_verified_is_refused_every_epoch(photo_folder, out, kind, options):
    dst = _kind_dst(kind, out, photo_folder)
    # Indexed as the stream reads: a TFRecordDataset of the same files numbers records alike.
    by_index = fl.WebDataset(str(dst)) if kind == "WebDataset" else fl.TFRecordDataset(str(dst))
    changed = 5
    where = by_index.describe(changed)
    shard = _flip_image(kind, by_index, changed)
    ds = _open(kind, dst)
    assert ds.verified_count == 12
    if kind == "TFRecordDataset":
        with pytest.raises(ChangedSinceVerifiedError, match="the record changed since it was verified") as info:
            ds[changed]
    else:
        with contextlib.closing(ds.records_for(0, 1)) as records:  # its shard files closed with it
            record = next(r for r in records if r.number == changed)
            with pytest.raises(ChangedSinceVerifiedError, match="changed since it was verified") as info:
                ds.plan_record(record, 0, 0)
    assert info.value.where == where and shard in where and "at byte" in where
    shuffle = kind != "TFRecordStream"  # read in file order
    common = dict(batch_size=4, device="cpu", return_index=True, seed=0, shuffle=shuffle, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fl.Loader(ds, on_error="skip", **common) as loader:
            for epoch in range(3):
                loader.set_epoch(epoch)
                seen = [int(i) for _, _, idx in loader for i in idx]
                assert changed not in seen and len(set(seen)) == 11, seen
                skips = [s for s in loader.skipped if s.epoch == epoch]
                assert [s.index for s in skips] == [changed], skips
                assert "changed since it was verified" in skips[0].error and shard in skips[0].where
    with fl.Loader(ds, **common) as loader, pytest.raises(DecodeError) as raised:
        for _ in loader:
            pass
    assert "changed since it was verified" in str(raised.value) and shard in str(raised.value)


def test_a_verified_tfrecord_checks_its_data_whatever_check_crc_says(photo_folder, out):
    dst = _kind_dst("TFRecordDataset", out, photo_folder)
    _flip_image("TFRecordDataset", fl.TFRecordDataset(str(dst)), 2)
    with pytest.raises(ChangedSinceVerifiedError):
        fl.TFRecordDataset(str(dst), check_crc=False).plan(2)
    # Not verified: only the frame's CRC says the record is damaged, as before.
    with pytest.raises(fl.TFRecordError, match="data CRC mismatch"):
        fl.TFRecordDataset(str(dst), verified=False).plan(2)


def test_a_malformed_verified_section_is_refused_naming_the_sidecar(photo_folder, out):
    dst = _kind_dst("TFRecordDataset", out, photo_folder)
    path = dst / SIDECAR["tfrecord"]
    meta = json.loads(path.read_text())
    name = sorted(meta["verified"]["records"])[0]
    meta["verified"]["records"][name] = meta["verified"]["records"][name][:-1]
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"{path}: a malformed 'verified' section .*{name}.*checksums for"):
        fl.TFRecordDataset(str(dst))


def test_a_webdataset_over_http_uses_the_checksums_of_its_sidecar(photo_folder, out):
    from wds_servers import http_server

    dst = _kind_dst("WebDataset", out, photo_folder)
    changed = 5
    _flip_image("WebDataset", fl.WebDataset(str(dst)), changed)
    with http_server(dst) as (base, _):
        urls = base + "/shard-{000000..000002}.tar"
        ds = fl.WebDataset(urls, fl.transforms.train(48, **CROP), cache_dir=str(out / "c"))
        assert ds.verified_count == 12 and ds.verified_by.startswith(f"fastload {fl.__version__}, strict, ")
        common = dict(batch_size=4, device="cpu", return_index=True, num_workers=0, on_error="skip")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with fl.Loader(ds, **common) as loader:
                seen = [int(i) for _, _, idx in loader for i in idx]
                (skip,) = loader.skipped
    assert set(seen) == set(range(12)) - {changed}  # (a skipped sample's place taken by another)
    assert skip.index == changed and "changed since it was verified" in skip.error and base in skip.where


def test_a_shard_with_another_sample_count_than_its_checksums_is_refused_naming_it(photo_folder, out):
    dst = _kind_dst("WebDataset", out, photo_folder)
    path = dst / SIDECAR["wds"]
    meta = json.loads(path.read_text())
    meta["samples"]["shard-000001.tar"] -= 1  # as if the shard had gained a sample since
    meta["verified"]["records"]["shard-000001.tar"].pop()
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"shard-000001.tar: 5 samples, but .* checksums of 4"):
        fl.WebDataset(str(dst))
    assert fl.WebDataset(str(dst), verified=False).verified_count == 0
