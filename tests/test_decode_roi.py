"""Region decode's lazy import of nvImageCodec."""

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
