"""The real-photo dataset builder: deterministic, ImageNet-like encodings, guarded marker."""

import os

import pytest

from fastload.photos.jpegs import jpeg_stats, make_photo_dataset


def read_all(root) -> dict:
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".jpg"):
                with open(os.path.join(folder, name), "rb") as f:
                    out[os.path.relpath(os.path.join(folder, name), root)] = f.read()
    return out


def test_photo_dataset_is_deterministic_and_photo_like(tmp_path):
    a = make_photo_dataset(str(tmp_path / "a"), num_images=24, num_classes=3)
    b = make_photo_dataset(str(tmp_path / "b"), num_images=24, num_classes=3)
    assert read_all(a) == read_all(b) and len(read_all(a)) == 24
    assert sorted(os.listdir(a)) == [".complete", "class_00", "class_01", "class_02"]
    stats = jpeg_stats(a)
    assert stats["images"] == 24
    assert 0.8 < stats["bits_per_pixel"]["p50"] < 2.8  # photographs, not noise (~3+) or flat images
    assert 256 <= stats["short_side"]["p5"] and stats["short_side"]["p95"] <= 512
    assert 75 <= stats["quality"]["p5"] and stats["quality"]["p95"] <= 95
    assert stats["subsampling"].get("4:2:0", 0) > 0.5


def test_photo_dataset_reuses_or_refuses(tmp_path):
    root = make_photo_dataset(str(tmp_path / "p"), num_images=4, num_classes=2)
    assert make_photo_dataset(root, num_images=4, num_classes=2) == root  # complete: reused
    with pytest.raises(ValueError, match="other parameters"):
        make_photo_dataset(root, num_images=5, num_classes=2)
    with pytest.raises(ValueError, match="num_classes"):
        make_photo_dataset(str(tmp_path / "q"), num_images=1, num_classes=2)
