"""Strict from the first decode: no sample that a full strict decode refuses reaches a batch.

The damaged files come from benchmarks/damage.py (real photographs, baseline and
progressive: cut short, no end-of-image marker, bytes changed in the scan data), the ones
the full strict decode refuses. The planner is made to want a region decode everywhere
(free in its costs): nvImageCodec's region decode lets most of this damage through, so
only the rule that plans it for trusted files alone keeps the batches clean.
"""

import os
import sys
import warnings

import numpy as np
import pytest

import fastload as fl
from fastload.decode import DecodeError, costs, get_decoder, plan, read_header, roi

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from damage import damaged_versions, encode  # noqa: E402

ROI = pytest.mark.skipif(not roi.available(), reason="region decode needs: pip install 'fastload[roi]'")


@pytest.fixture
def region_wanted(monkeypatch):
    """The process planner, built from costs where a region decode costs nothing: it would
    plan one for every baseline sample if it were allowed to (workers inherit the setting)."""
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


@pytest.fixture(scope="module")
def damaged_folder(tmp_path_factory):
    """root/c0/*.jpg: intact photos and damaged copies the full strict decode refuses."""
    try:
        from fastload.photos.bundled import source_photos
    except ImportError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("damaged") / "c0"
    root.mkdir()
    rng = np.random.default_rng(3)
    bad = set()
    for p, (name, rgb) in enumerate(sorted(source_photos(gray=False).items())[:6]):
        progressive = p % 3 == 2
        data = encode(rgb, 90, progressive)
        for q in (80, 90, 95):  # intact files outnumber damaged ones, as in a real dataset
            (root / f"{p}-intact-q{q}.jpg").write_bytes(encode(rgb, q, progressive))
        kinds = {}
        for d in damaged_versions(name, data, progressive, rng, per_kind=3):
            if d.kind not in kinds and _refused(d.data):
                kinds[d.kind] = d.data
        for k, (kind, blob) in enumerate(sorted(kinds.items())):
            if (p + k) % 2 == 0 or kind == "no EOI":  # about half of them, every kind somewhere
                file = f"{p}-damaged-{kind.replace(' ', '-').replace(',', '')}.jpg"
                (root / file).write_bytes(blob)
                bad.add(file)
    return str(root.parent), bad


def _damaged_indices(ds, bad):
    return {i for i in range(len(ds)) if os.path.basename(ds.describe(i)) in bad}


@ROI
def test_the_damage_is_what_region_decode_lets_through(damaged_folder, region_wanted):
    """The set is meaningful: a planner allowed regions plans them, and they pass damage."""
    root, bad = damaged_folder
    ds = fl.ImageFolder(root, transform=fl.transforms.train(64, scale=(0.05, 0.5)))
    damaged = _damaged_indices(ds, bad)
    kinds = {os.path.basename(ds.describe(i)).split("-", 2)[2] for i in damaged}
    assert {"truncated.jpg", "no-EOI.jpg"} <= kinds and any(k.startswith("flip") for k in kinds), kinds
    allowed = plan.Planner(region_wanted, region=True)
    passed = 0
    for i in damaged:
        data, _ = ds.read(i)
        header = read_header(data)
        crop = ds.transform.plan(header.height, header.width, np.random.default_rng(i))
        chosen = allowed.choose(header, crop)
        if chosen.region is not None:
            try:
                chosen.decode(data, get_decoder(), header)
                passed += 1
            except DecodeError:
                pass
    assert passed >= 2, "the region decoder refused all of the damage: nothing to guard"


@ROI
def test_ds_i_refuses_every_damaged_sample_in_every_epoch(damaged_folder, region_wanted):
    root, bad = damaged_folder
    ds = fl.ImageFolder(root, transform=fl.transforms.train(64, scale=(0.05, 1.0)))
    damaged = _damaged_indices(ds, bad)
    kinds = set()
    for epoch in range(6):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            kinds.add(ds.plan(i, epoch).steps.plan.kind)
            if i in damaged:
                with pytest.raises(DecodeError, match=os.path.basename(ds.describe(i))):
                    ds[i]
            else:
                ds[i]
    assert "region" not in kinds and any(k.startswith("scale") for k in kinds), kinds


@ROI
@pytest.mark.parametrize("backend", ["process", "thread"])
def test_no_damaged_jpeg_reaches_a_batch_in_any_epoch(damaged_folder, region_wanted, backend):
    """From the first epoch on, on either backend: skipped (on_error="skip") or raised, never delivered."""
    root, bad = damaged_folder
    ds = fl.ImageFolder(root, transform=fl.transforms.train(48, scale=(0.05, 0.5)))
    damaged = _damaged_indices(ds, bad)
    options = dict(batch_size=4, num_workers=2, backend=backend, device="cpu", return_index=True, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip warnings
        with fl.Loader(ds, on_error="skip", **options) as loader:
            for epoch in range(4):
                seen = {int(i) for _, _, idx in loader for i in idx}
                assert not damaged & seen, f"epoch {epoch} delivered a damaged JPEG"
                assert {s.index for s in loader.skipped if s.epoch == epoch} == damaged
    with fl.Loader(ds, **options) as loader:
        for _ in range(2):
            with pytest.raises(DecodeError) as info:
                for _ in loader:
                    pass
            assert any(name in str(info.value) for name in bad)
