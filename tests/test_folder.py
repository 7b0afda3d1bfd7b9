import os

import numpy as np
import pytest

import fastload as fl
from fastload.decode import DecodeError

from conftest import jpeg_bytes, make_image, write_folder


def test_image_folder_classes_labels_and_order(folder):
    ds = fl.ImageFolder(folder)
    assert ds.classes == ["c0", "c1", "c2"] and ds.class_to_idx == {"c0": 0, "c1": 1, "c2": 2}
    assert len(ds) == 24 and ds.labels.tolist() == [0] * 8 + [1] * 8 + [2] * 8
    assert ds.paths[0] == "c0/000.jpg" and ds.paths[23] == "c2/007.jpg"
    assert ds.paths[:2] == ["c0/000.jpg", "c0/001.jpg"] and ds.paths[-1:] == ["c2/007.jpg"]  # as a list slices
    assert ds.paths[22::-11] == ["c2/006.jpg", "c1/003.jpg", "c0/000.jpg"] and ds.paths[5:2] == []
    img, label = ds[9]
    assert img.dtype == np.uint8 and img.ndim == 3 and label == 1


def test_image_folder_holds_no_per_sample_python_objects(folder):
    ds = fl.ImageFolder(folder)
    for value in vars(ds).values():
        assert not (isinstance(value, (list, dict, tuple)) and len(value) >= len(ds)), value


def test_extension_filter_nested_dirs_and_hidden(tmp_path):
    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / ".git").mkdir()
    data = jpeg_bytes(make_image(0, 16, 16))
    for p in ("a/1.JPG", "a/deep/2.jpeg", "a/notes.txt", "b/3.jpg", ".git/4.jpg"):
        (tmp_path / p).write_bytes(data)
    ds = fl.ImageFolder(tmp_path)
    assert list(ds.paths) == ["a/1.JPG", "a/deep/2.jpeg", "b/3.jpg"]
    assert fl.ImageFolder(tmp_path, extensions=(".jpeg",), allow_empty=True).labels.tolist() == [0]


def test_an_empty_class_folder_is_an_error_naming_it_as_torchvision_raises(tmp_path):
    data = jpeg_bytes(make_image(0, 16, 16))
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        (tmp_path / c / "1.jpg").write_bytes(data)
    (tmp_path / "cow").mkdir()
    (tmp_path / "cow" / "notes.txt").write_text("no image here")
    with pytest.raises(FileNotFoundError, match=f"class folder.* {tmp_path / 'cow'} hold no image.*allow_empty=True"):
        fl.ImageFolder(tmp_path)
    ds = fl.ImageFolder(tmp_path, allow_empty=True)
    assert ds.classes == ["cat", "cow", "dog"] and ds.labels.tolist() == [0, 2]


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        fl.ImageFolder(tmp_path / "nope")
    with pytest.raises(ValueError, match="no class subfolders"):
        fl.ImageFolder(tmp_path)
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "x.txt").write_text("hi")
    with pytest.raises(ValueError, match="no images"):
        fl.ImageFolder(tmp_path)


def test_corrupt_file_error_names_file_and_index(tmp_path):
    write_folder(tmp_path, num_classes=1, per_class=3)
    bad = tmp_path / "c0" / "001.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    ds = fl.ImageFolder(tmp_path)
    with pytest.raises(DecodeError, match=r"sample 1 \(.*c0/001\.jpg\)"):
        ds[1]


def test_image_list_parses_paths_with_spaces_and_comments(tmp_path):
    write_folder(tmp_path / "imgs", num_classes=2, per_class=2)
    os.rename(tmp_path / "imgs" / "c1" / "000.jpg", tmp_path / "imgs" / "c1" / "my photo.jpg")
    lst = tmp_path / "train.txt"
    lst.write_text("# path label\nimgs/c0/000.jpg 0\n\nimgs/c1/my photo.jpg 7\n")
    ds = fl.ImageList(lst)
    assert list(ds.paths) == ["imgs/c0/000.jpg", "imgs/c1/my photo.jpg"]
    assert ds.labels.tolist() == [0, 7]
    assert ds[1][0].shape[2] == 3


@pytest.mark.parametrize("line", ["imgs/a.jpg", "imgs/a.jpg x", "imgs/a.jpg -1"])
def test_image_list_bad_line_names_line_number(tmp_path, line):
    lst = tmp_path / "l.txt"
    lst.write_text(f"ok.jpg 1\n{line}\n")
    with pytest.raises(ValueError, match=r"l\.txt:2: expected"):
        fl.ImageList(lst)


def test_image_list_from_arrays_and_errors(tmp_path, folder):
    ds = fl.ImageList.from_arrays(["c0/000.jpg", "c2/001.jpg"], [5, 6], root=folder)
    assert len(ds) == 2 and ds[1][1] == 6
    with pytest.raises(ValueError, match="labels must be >= 0; sample 1 has -3"):
        fl.ImageList.from_arrays(["c0/000.jpg", "c2/001.jpg"], [5, -3], root=folder)
    with pytest.raises(ValueError, match="2 paths but 1 labels"):
        fl.ImageList.from_arrays(["a", "b"], [1], root=folder)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        fl.ImageList(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ValueError, match="names no images"):
        fl.ImageList(tmp_path / "empty.txt")


def test_a_file_that_is_no_image_is_named_not_pillows_buffer(tmp_path):
    write_folder(tmp_path, num_classes=1, per_class=2)
    (tmp_path / "c0" / "notes.jpg").write_text("# not an image\n")
    ds = fl.ImageFolder(tmp_path)
    index = list(ds.paths).index("c0/notes.jpg")
    with pytest.raises(DecodeError) as info:
        ds.load(index)
    text = str(info.value)
    assert f"({tmp_path / 'c0' / 'notes.jpg'}): not an image" in text and "BytesIO" not in text, text
