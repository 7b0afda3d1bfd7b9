"""Strictness established once, by checksum: ``fastload verify``, its manifest, and datasets
that decode verified bytes cheaply and refuse changed ones (fastload/verified.py)."""

import json
import os
import sys
import warnings

import numpy as np
import pytest
from conftest import flip_scan_bytes, photo_jpegs

import fastload as fl
from fastload.cli import main
from fastload.decode import DecodeError, costs, get_decoder, plan, roi
from fastload.verified import MANIFEST_NAME, NOT_VERIFIED, ChangedSinceVerifiedError, crc32c, load_manifest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

ROI = pytest.mark.skipif(not roi.available(), reason="region decode needs: pip install 'fastload[roi]'")


@pytest.fixture
def region_wanted(monkeypatch):
    """The process planner, from costs where a region decode costs nothing: it plans one for
    every baseline sample it is allowed to (workers inherit the setting)."""
    free = {**costs.DEFAULT_COSTS, "decode": {**costs.DEFAULT_COSTS["decode"], "region": [0.0, 0.0, 0.0]}}
    monkeypatch.setattr(plan, "DEFAULT_COSTS", free)  # what get_planner reads under FASTLOAD_NO_CALIBRATION=1
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    monkeypatch.delenv("FASTLOAD_ROI", raising=False)
    plan.set_planner(None)
    yield free
    plan.set_planner(None)


def _refused(data: bytes) -> bool:
    try:
        get_decoder("simplejpeg").decode(data)
    except DecodeError:
        return True
    return False


def _damaged(data: bytes) -> bytes:
    """``data`` with scan bytes changed so that the strict decode refuses it."""
    for seed in range(200):
        bad = flip_scan_bytes(data, seed)
        if _refused(bad):
            return bad
    raise AssertionError("no damage the strict decode refuses")


@pytest.fixture
def photo_folder(tmp_path):
    """root/c0, root/c1: 12 photos (JPEG, 300-500 pixels on the shorter side)."""
    blobs = photo_jpegs((300, 500), 2, seed=7)[:12]
    for i, blob in enumerate(blobs):
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        (tmp_path / f"c{i % 2}" / f"{i:02d}.jpg").write_bytes(blob)
    return tmp_path


def test_crc32c_is_castagnoli():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_verify_of_a_folder_without_images_is_an_error_writing_nothing(tmp_path, capsys):
    # A user review: `fastload verify out.lmdb` printed "verified 0 files", exit 0, and wrote a
    # manifest into the LMDB's folder.
    lmdb_like = tmp_path / "out.lmdb"
    lmdb_like.mkdir()
    (lmdb_like / "data.mdb").write_bytes(b"x" * 100)
    for folder in (lmdb_like, tmp_path / "empty"):
        folder.mkdir(exist_ok=True)
        assert main(["verify", str(folder), "--quiet"]) == 2
        assert "no image files" in capsys.readouterr().err and MANIFEST_NAME not in os.listdir(folder)


def test_verify_lists_what_fails_and_writes_a_manifest_of_the_rest(photo_folder, capsys):
    good = (photo_folder / "c0" / "00.jpg").read_bytes()
    (photo_folder / "c0" / "bad-flip.jpg").write_bytes(_damaged(good))
    (photo_folder / "c1" / "bad-cut.jpg").write_bytes(good[: len(good) // 2])
    assert main(["verify", str(photo_folder), "--quiet", "--workers", "2"]) == 1
    err = capsys.readouterr().err
    for name in ("c0/bad-flip.jpg", "c1/bad-cut.jpg"):
        assert f"FAILED {photo_folder / name}:" in err, err
    manifest = photo_folder / MANIFEST_NAME
    doc = json.loads(manifest.read_text())
    assert doc["strict"] is True and doc["fastload"] == fl.__version__ and doc["checksum"] == "crc32c"
    rows = {r[0]: r for r in doc["files"]}
    assert sorted(rows) == sorted(f"c{i % 2}/{i:02d}.jpg" for i in range(12))
    for rel, (_, size, mtime_ns, crc, decoder, strict) in rows.items():
        data = (photo_folder / rel).read_bytes()
        assert (size, mtime_ns, crc) == (len(data), os.stat(photo_folder / rel).st_mtime_ns, crc32c(data))
        assert decoder in ("simplejpeg", "turbojpeg") and strict is True
    assert sorted(os.listdir(photo_folder)) == ["c0", "c1", MANIFEST_NAME]  # no temporary file left
    assert main(["verify", str(photo_folder), "--quiet", "--allow-bad"]) == 0
    (photo_folder / "c0" / "bad-flip.jpg").unlink()
    (photo_folder / "c1" / "bad-cut.jpg").unlink()
    assert main(["verify", str(photo_folder), "--quiet"]) == 0


def test_the_manifest_is_readable_by_those_who_read_the_images(photo_folder):
    # Written through mkstemp (0600), a shared dataset's manifest was the verifier's alone:
    # it gets the mode open() gives under the umask, as the images have.
    old = os.umask(0o022)
    try:
        assert main(["verify", str(photo_folder), "--quiet"]) == 0
    finally:
        os.umask(old)
    assert os.stat(photo_folder / MANIFEST_NAME).st_mode & 0o777 == 0o644


def test_a_file_of_another_format_is_listed_not_strict_and_not_verified(photo_folder, capsys):
    from PIL import Image

    Image.new("RGB", (40, 30), (200, 10, 10)).save(photo_folder / "c0" / "red.png")
    assert main(["verify", str(photo_folder), "--quiet"]) == 0
    assert "1 not JPEG" in capsys.readouterr().out
    doc = json.loads((photo_folder / MANIFEST_NAME).read_text())
    rows = {r[0]: r for r in doc["files"]}
    assert rows["c0/red.png"][4:] == ["pillow/opencv", False] and rows["c0/00.jpg"][5] is True
    checksums = load_manifest(str(photo_folder / MANIFEST_NAME))
    assert "c0/red.png" not in checksums and "c0/00.jpg" in checksums
    ds = fl.ImageFolder(photo_folder)
    assert ds.verified_count == 12 and len(ds) == 13
    png = list(ds.paths[:]).index("c0/red.png")
    assert ds.verified_checksum(png) == NOT_VERIFIED


def test_a_version_1_manifest_counts_only_jpeg_decoders_entries_strict(photo_folder):
    from PIL import Image

    Image.new("RGB", (40, 30), (200, 10, 10)).save(photo_folder / "c0" / "red.png")
    assert main(["verify", str(photo_folder), "--quiet"]) == 0
    path = photo_folder / MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc.update(version=1, columns=doc["columns"][:5], files=[r[:5] for r in doc["files"]])
    path.write_text(json.dumps(doc))
    assert sorted(load_manifest(str(path))) == sorted(f"c{i % 2}/{i:02d}.jpg" for i in range(12))


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda d: d.update(strict=False), "'strict' is False"),
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d["files"].append(list(d["files"][0])), "listed twice"),
        (lambda d: d["files"][0].__setitem__(3, "abc"), "entry 0"),
        (lambda d: d["files"][0].__setitem__(3, 2**32), "entry 0"),
    ],
)
def test_a_malformed_manifest_is_refused_by_name(photo_folder, edit, problem):
    assert main(["verify", str(photo_folder), "--quiet"]) == 0
    path = photo_folder / MANIFEST_NAME
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=problem) as info:
        fl.ImageFolder(photo_folder)
    assert str(path) in str(info.value)
    assert fl.ImageFolder(photo_folder, verified=False).verified_count == 0


def test_a_manifest_elsewhere_and_list_files(photo_folder, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("manifests") / "train.json"
    assert main(["verify", str(photo_folder), "--quiet", "--manifest", str(elsewhere)]) == 0
    assert not (photo_folder / MANIFEST_NAME).exists()
    assert fl.ImageFolder(photo_folder).verified_count == 0
    assert fl.ImageFolder(photo_folder, verified=elsewhere).verified_count == 12
    listing = photo_folder / "train.txt"
    listing.write_text("c0/00.jpg 0\nc1/01.jpg 1\nc0/new.jpg 0\n")
    (photo_folder / "c0" / "new.jpg").write_bytes((photo_folder / "c0" / "00.jpg").read_bytes())
    ds = fl.ImageList(listing, verified=str(elsewhere))
    assert ds.verified_count == 2 and ds.verified_checksum(2) == -1
    with pytest.raises(TypeError, match="verified must be"):
        fl.ImageFolder(photo_folder, verified=3)


@ROI
def test_verified_bytes_take_region_plans_and_others_stay_strict(photo_folder, region_wanted):
    assert main(["verify", str(photo_folder), "--quiet"]) == 0
    (photo_folder / "c0" / "late.jpg").write_bytes((photo_folder / "c0" / "00.jpg").read_bytes())
    transform = fl.transforms.train(64, scale=(0.05, 0.5))
    ds = fl.ImageFolder(photo_folder, transform=transform)
    late = next(i for i in range(len(ds)) if ds.describe(i).endswith("late.jpg"))
    plans = {i: ds.plan(i) for i in range(len(ds))}
    assert all(p.verified == (i != late) for i, p in plans.items())
    assert plans[late].steps.plan.kind != "region"
    assert sum(p.steps.plan.kind == "region" for p in plans.values()) >= 8
    off = fl.ImageFolder(photo_folder, transform=transform, verified=False)
    assert not any(off.plan(i).steps.plan.kind == "region" or off.plan(i).verified for i in range(len(off)))


def _change(ds, rel: str, how: str) -> int:
    """Rewrites file ``rel`` of ``ds`` after verification; its index."""
    path = os.path.join(ds.root, rel)
    with open(path, "rb") as f:
        data = f.read()
    if how == "damaged":  # damage the strict decode refuses and region decode mostly lets through
        data = _damaged(data)
    else:  # another intact JPEG: decodes, but is not the file that was verified
        other = os.path.join(ds.root, "c1", "01.jpg")
        with open(other, "rb") as f:
            data = f.read()
    with open(path, "wb") as f:
        f.write(data)
    return next(i for i in range(len(ds)) if ds.describe(i) == path)


@ROI
@pytest.mark.parametrize("how", ["damaged", "replaced"])
@pytest.mark.parametrize("options", [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, backend="thread")])
def test_a_file_changed_after_verify_is_refused_every_time(photo_folder, region_wanted, options, how):
    assert main(["verify", str(photo_folder), "--quiet"]) == 0
    ds = fl.ImageFolder(photo_folder, transform=fl.transforms.train(48, scale=(0.05, 0.5)))
    changed = _change(ds, "c0/04.jpg", how)
    path = ds.describe(changed)
    with pytest.raises(ChangedSinceVerifiedError, match=f"the file changed since it was verified: {path}"):
        ds[changed]
    common = dict(batch_size=4, device="cpu", return_index=True, seed=0, shuffle=True, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip warnings
        with fl.Loader(ds, on_error="skip", **common) as loader:
            for epoch in range(3):
                loader.set_epoch(epoch)
                seen = {int(i) for _, _, idx in loader for i in idx}
                assert changed not in seen, f"epoch {epoch} delivered the changed file"
                assert {s.index for s in loader.skipped if s.epoch == epoch} == {changed}
    with fl.Loader(ds, **common) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            with pytest.raises(DecodeError, match=f"the file changed since it was verified: {path}"):
                for _ in loader:
                    pass


def test_the_deprecated_switch_warns_once_and_trusts_every_sample(monkeypatch, region_wanted):
    if not roi.available():
        pytest.skip("region decode needs: pip install 'fastload[roi]'")
    monkeypatch.setenv("FASTLOAD_ROI", "trusted")
    monkeypatch.setattr(plan, "_warned_trusted", False)
    plan.set_planner(None)
    with pytest.warns(DeprecationWarning, match="FASTLOAD_ROI=trusted is deprecated"):
        planner = plan.get_planner()
    assert planner.region
    plan.set_planner(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan.get_planner()  # once per process


def test_a_missing_manifest_path_is_named(photo_folder):
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        fl.ImageFolder(photo_folder, verified=str(photo_folder / "nowhere.json"))


def test_checks_are_per_sample_numbers(photo_folder):
    assert main(["verify", str(photo_folder), "--quiet"]) == 0
    ds = fl.ImageFolder(photo_folder)
    want = load_manifest(str(photo_folder / MANIFEST_NAME))
    assert [ds.verified_checksum(i) for i in range(len(ds))] == [want[p] for p in ds.paths]
    assert isinstance(ds._checksums.array, np.ndarray)


@ROI
def test_verified_pixels_differ_only_where_the_plan_does_and_by_what_the_guide_says(tmp_path, region_wanted, monkeypatch):
    """docs/guides/transforms.md: a region decode gives the full decode's pixels (1 level), so a
    verified sample differs from the strict one only where its plan changed, by the replaced
    plan's filtering: at most 44 levels, mean 0.54 over the changed images (300 photos, a
    seeded Loader, benchmarks/verified_pixels.py). Here per sample on 60 of them, built-in costs."""
    monkeypatch.setattr(plan, "DEFAULT_COSTS", costs.DEFAULT_COSTS)  # the real prices: plans as users get them
    plan.set_planner(None)
    for i, blob in enumerate(photo_jpegs((256, 512), 6, seed=0)[:60]):
        (tmp_path / f"c{i % 3}").mkdir(exist_ok=True)
        (tmp_path / f"c{i % 3}" / f"{i:04d}.jpg").write_bytes(blob)
    assert main(["verify", str(tmp_path), "--quiet"]) == 0
    strict, cheap = (fl.ImageFolder(tmp_path, transform=fl.transforms.train(224), verified=v) for v in (False, True))
    changed, regions, diffs = 0, 0, []
    for i in range(len(strict)):
        kind_s, kind_v = strict.plan(i, 1, 2).steps.plan.kind, cheap.plan(i, 1, 2).steps.plan.kind
        a, b = strict.load(i, 1, 2)[0].astype(np.int16), cheap.load(i, 1, 2)[0]
        d = np.abs(a - b)
        regions += kind_v == "region"
        if kind_s == kind_v:
            assert d.max() == 0, (i, kind_s)
            continue
        assert kind_v == "region", (kind_s, kind_v)
        assert d.max() <= (1 if kind_s == "full" else 44), (i, kind_s, d.max())
        if d.max():
            changed += 1
            diffs.append(d.mean())
    assert regions >= 10 and changed >= 5, (regions, changed)
    assert np.mean(diffs) <= 0.8, diffs


# --- converters: verified and recorded ---------------------------------------------------------


@ROI
@pytest.mark.parametrize("options", [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, backend="thread")])
def test_lmdb_converted_with_verify_records_checksums_and_refuses_changed_records(
    photo_folder, tmp_path_factory, region_wanted, capsys, options
):
    import lmdb

    from fastload.convert import main as convert_main

    good = (photo_folder / "c0" / "00.jpg").read_bytes()
    (photo_folder / "c1" / "bad-flip.jpg").write_bytes(_damaged(good))
    dst = str(tmp_path_factory.mktemp("lmdb") / "train.lmdb")
    with pytest.raises(SystemExit) as exited:
        convert_main("lmdb", [str(photo_folder), dst, "--verify", "--workers", "2"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "1 of 13 records failed" in err and "does not decode strictly" in err, err
    assert str(photo_folder / "c1" / "bad-flip.jpg") in err, err
    ds = fl.LMDBDataset(dst, transform=fl.transforms.train(48, scale=(0.05, 0.5)))
    assert ds.verified_count == 12 and ds.verified_by.startswith(f"fastload {fl.__version__}, strict, ")
    bad = next(i for i in range(len(ds)) if _refused(ds.read(i)[0]))
    assert ds.verified_checksum(bad) == -1 and not ds.plan(bad).verified
    assert sum(ds.plan(i).steps.plan.kind == "region" for i in range(len(ds))) >= 8
    assert fl.LMDBDataset(dst, verified=False).verified_count == 0
    # A record rewritten after the conversion (damage the region decode lets through):
    changed = 3
    key = ds.keys.get_bytes(changed)
    env = lmdb.open(dst, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(key, _damaged(bytes(txn.get(key))))
    env.close()
    ds = fl.LMDBDataset(dst, transform=fl.transforms.train(48, scale=(0.05, 0.5)))
    where = ds.describe(changed)
    with pytest.raises(ChangedSinceVerifiedError, match="the record changed since it was verified"):
        ds[changed]
    common = dict(batch_size=4, device="cpu", return_index=True, seed=0, shuffle=True, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fl.Loader(ds, on_error="skip", **common) as loader:
            for epoch in range(3):
                loader.set_epoch(epoch)
                seen = {int(i) for _, _, idx in loader for i in idx}
                assert not {changed, bad} & seen
                assert {s.index for s in loader.skipped if s.epoch == epoch} == {changed, bad}
    with fl.Loader(ds, **common) as loader, pytest.raises(DecodeError) as info:
        for _ in loader:
            pass
    assert where in str(info.value) or ds.describe(bad) in str(info.value)
