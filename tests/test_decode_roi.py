"""Region decode's lazy import of nvImageCodec."""

import os

import numpy as np
import pytest

from fastload.decode import roi


@pytest.fixture
def fresh_import(monkeypatch):
    monkeypatch.setattr(roi, "_module", None)
    monkeypatch.setattr(roi, "_failed", None)


def test_ctrl_c_during_the_import_is_a_keyboard_interrupt_not_a_missing_library(monkeypatch, fresh_import):
    def interrupted():
        # What pybind11 makes of a KeyboardInterrupt raised while its module initialises.
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e

    monkeypatch.setattr(roi, "_import_quietly", interrupted)
    monkeypatch.delenv("FASTLOAD_ROI", raising=False)
    with pytest.raises(KeyboardInterrupt):
        roi.available()
    monkeypatch.setattr(roi, "_import_quietly", lambda: "the module")
    assert roi.module() == "the module"  # the interrupted import is tried again, not remembered as missing


def test_a_missing_library_is_remembered_and_named(monkeypatch, fresh_import):
    calls = []

    def missing():
        calls.append(1)
        raise ImportError("No module named 'nvidia'")

    monkeypatch.setattr(roi, "_import_quietly", missing)
    monkeypatch.delenv("FASTLOAD_ROI", raising=False)
    assert not roi.available() and not roi.available()
    with pytest.raises(ImportError, match="region decode needs nvImageCodec"):
        roi.module()
    assert len(calls) == 1


def _info(monkeypatch, capsys) -> str:
    from fastload.cli import main

    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")  # no calibration run for the default decoder's line
    monkeypatch.delenv("FASTLOAD_ROI", raising=False)
    assert main(["info"]) == 0
    return capsys.readouterr().out


@pytest.mark.skipif(not roi.available(), reason="region decode needs: pip install 'fastload[roi]'")
def test_fastload_info_names_the_region_decoder_and_its_library_versions(monkeypatch, capsys, nvimgcodec_regions):
    import re

    out = _info(monkeypatch, capsys)
    turbo = roi.bundled_libjpeg_turbo()
    assert turbo is not None and re.fullmatch(r"3\.\d+\.\d+", turbo), turbo  # libjpeg-turbo 3 inside the wheel
    line = f"region decoder: nvimgcodec-cpu (nvImageCodec {roi.version()}, CPU backend, libjpeg-turbo {turbo} inside), "
    assert line + "planned only for bytes verified strictly before" in out, out
    assert roi.get_region_decoder().name == "nvimgcodec-cpu"  # the decoder that runs is the one named


def test_fastload_info_says_when_no_region_decoder_is_installed(monkeypatch, capsys, fresh_import, nvimgcodec_regions):
    def missing():
        raise ImportError("No module named 'nvidia'")

    monkeypatch.setattr(roi, "_import_quietly", missing)
    assert roi.describe() is None
    assert "region decoder: none (not installed: pip install 'fastload[roi]'" in _info(monkeypatch, capsys)


# --- libjpeg-turbo 3's TurboJPEG API (fastload.decode.roi_turbo) ------------------------------


@pytest.fixture
def turbo3(monkeypatch):
    """A libturbojpeg >= 3.0: the system's, or the file FASTLOAD_TEST_LIBTURBOJPEG3 names (e.g. the
    one the ``turbojpeg`` wheel bundles in ``turbojpeg.libs/``); the test is skipped without one."""
    from fastload.decode import roi_turbo, turbo

    path = os.environ.get("FASTLOAD_TEST_LIBTURBOJPEG3")
    if path:

        def library_path() -> str:  # as turbo._library_path finds the system's: hidden by the variable
            if os.environ.get("FASTLOAD_NO_SYSTEM_TURBOJPEG"):
                raise turbo.LibraryProblem("hidden by FASTLOAD_NO_SYSTEM_TURBOJPEG=1")
            return path

        monkeypatch.setattr(turbo, "_library_path", library_path)
    monkeypatch.delenv("FASTLOAD_NO_SYSTEM_TURBOJPEG", raising=False)
    monkeypatch.delenv("FASTLOAD_ROI", raising=False)
    monkeypatch.setattr(roi_turbo, "_checked", None)
    monkeypatch.setattr(roi, "_decoder", None)
    if not roi_turbo.available():
        pytest.skip("needs libjpeg-turbo >= 3.0's libturbojpeg (system, or FASTLOAD_TEST_LIBTURBOJPEG3=PATH)")
    return roi_turbo


def _boxes(rng, h: int, w: int) -> list[tuple[int, int, int, int]]:
    """Random boxes, and boxes on every edge (the iMCU widening and the last rows)."""
    boxes = [(0, 0, h, w), (h - 1, w - 1, h, w), (0, 1, 7, w), (5, 0, h, 9), (h // 2, w // 3, h, w - 5)]
    for _ in range(8):
        y0, x0 = int(rng.integers(0, h - 1)), int(rng.integers(0, w - 1))
        boxes.append((y0, x0, int(rng.integers(y0 + 1, h + 1)), int(rng.integers(x0 + 1, w + 1))))
    return boxes


def test_libjpeg_turbo_3_region_decode_is_the_full_decode_cropped(turbo3):
    from conftest import jpeg_bytes, make_image, photo_jpegs

    from fastload.decode import get_decoder

    rd = roi.get_region_decoder()
    assert isinstance(rd, turbo3.TurboRegionDecoder)  # taken before nvImageCodec
    blobs = photo_jpegs((256, 512), 1, seed=7)[:4] + [jpeg_bytes(make_image(3, 181, 243), 90, mode="L")]
    blobs += [jpeg_bytes(make_image(5, 150, 211), 88)]  # Pillow's default: 4:2:0
    dec, rng = get_decoder("simplejpeg"), np.random.default_rng(1)
    for data in blobs:
        full = dec.decode(data)
        boxes = _boxes(rng, *full.shape[:2])
        for box, batched in zip(boxes, rd.decode_batch([data] * len(boxes), boxes)):
            y0, x0, y1, x1 = box
            alone = rd.decode(data, *box)
            assert alone.shape == (y1 - y0, x1 - x0, 3), box
            assert np.array_equal(alone, full[y0:y1, x0:x1]), box  # measured: identical (RESULTS.md)
            assert batched is not None and np.array_equal(batched, alone), box


def test_without_libjpeg_turbo_3_regions_go_to_nvimgcodec(turbo3, monkeypatch):
    if not roi.available():
        pytest.skip("region decode needs: pip install 'fastload[roi]'")
    monkeypatch.setenv("FASTLOAD_NO_SYSTEM_TURBOJPEG", "1")  # hides the system library
    monkeypatch.setattr(turbo3, "_checked", None)
    assert roi.available() and isinstance(roi.get_region_decoder(), roi.RegionDecoder)
    assert roi.describe().startswith("nvimgcodec-cpu (nvImageCodec ")


def test_fastload_info_names_libjpeg_turbo_3_when_it_decodes_regions(turbo3, monkeypatch, capsys):
    out = _info(monkeypatch, capsys)
    rd = roi.get_region_decoder()
    assert rd.version is not None and rd.version.startswith(("2.1.9", "3."))  # 2.1.9x: 3.0's betas
    assert f"region decoder: libjpeg-turbo-3 (libjpeg-turbo {rd.version}, " in out, out


def test_libjpeg_turbo_3_region_decode_never_reads_the_rows_below_the_box(turbo3):
    """What makes it cheap, and why it is for verified bytes only: the scan data below the box
    is never read, so a file cut short there decodes (the strict full decode refuses it)."""
    from conftest import photo_jpegs

    from fastload.decode import DecodeError, get_decoder

    data = photo_jpegs((400, 512), 1, seed=3)[0]
    dec = get_decoder("simplejpeg")
    full = dec.decode(data)
    h, w = full.shape[:2]
    cut = data[: len(data) * 6 // 10] + b"\xff\xd9"  # the bottom 40% of the scan data gone
    with pytest.raises(DecodeError):
        dec.decode(cut)
    box = (h // 10, w // 4, h // 4, w // 2)
    top = roi.get_region_decoder().decode(cut, *box)
    assert np.array_equal(top, full[box[0] : box[2], box[1] : box[3]])
