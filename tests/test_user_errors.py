"""What a torchvision/timm user writes first, and what fastload answers: the misuses found
by a newcomer's trial, each an error that says what to write instead (or now just works)."""

import os
import warnings

import numpy as np
import pytest
import refs
import torch
from PIL import Image

import fastload as fl
from fastload.augment import BatchTransforms

T = fl.transforms


class ArrayDataset(torch.utils.data.Dataset):
    """A user's own map-style dataset: uint8 arrays (H×W or H×W×C) and int labels."""

    def __init__(self, shape, n=4):
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(n)]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], i % 2


def test_torchvision_batch_augmentations_name_their_fastload_forms():
    refs.torchvision()
    from torchvision.transforms import v2

    for given, form in ((v2.MixUp(num_classes=4), "fl.augment.MixUp(alpha=..., num_classes=...)"),
                        (v2.CutMix(num_classes=4), "fl.augment.CutMix(alpha=..., num_classes=...)")):
        with pytest.raises(TypeError) as info:
            BatchTransforms([given])
        assert f"batch_transform[0] is torchvision's {type(given).__name__}: use {form}" in str(info.value)
    # The per-sample error names the torchvision forms too (their arguments are alpha=, not mixup_alpha=).
    with pytest.raises(TypeError, match=r"CutMix -> fl\.augment\.CutMix\(\.\.\.\)"):
        T.Compose([v2.CutMix(num_classes=4)])


def test_timm_mixup_as_batch_transform_names_fl_augment_mixup():
    refs.timm()
    from timm.data import Mixup

    with pytest.raises(TypeError, match=r"batch_transform is timm's Mixup: use fl\.augment\.Mixup\(\.\.\.\)"):
        fl.Loader(ArrayDataset((8, 8, 3)), batch_size=2, device="cpu", batch_transform=Mixup(num_classes=4))


def test_loader_transform_keyword_points_to_the_dataset():
    with pytest.raises(TypeError) as info:
        fl.Loader(ArrayDataset((8, 8, 3)), batch_size=2, device="cpu", transform=[T.RandomHorizontalFlip()])
    assert "unknown Loader option(s) ['transform']" in str(info.value)
    assert "fl.WrappedDataset(your_dataset, transform=[...])" in str(info.value)


def test_one_channel_images_name_mean_and_std():
    with pytest.raises(ValueError) as info, fl.Loader(ArrayDataset((8, 8)), batch_size=2, device="cpu") as loader:
        next(iter(loader))
    assert ("batch has 1 channels but mean/std have 3: give fl.Loader normalize=fl.Normalize(mean=..., std=...) "
            "with 1 values") in str(info.value)
    # What the message says works.
    with fl.Loader(ArrayDataset((8, 8)), batch_size=2, device="cpu",
                   normalize=fl.Normalize(mean=(0.5,), std=(0.5,))) as loader:
        images, _ = next(iter(loader))
    assert images.shape == (2, 1, 8, 8)


def test_resize_of_a_read_only_array_warns_nothing():
    # np.asarray(PIL image): what a user's Dataset returning PIL images gives the transforms.
    img = np.asarray(Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8)))
    assert not img.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = T.Resize(24)(img, np.random.default_rng(0))
    np.testing.assert_array_equal(out, T.Resize(24)(img.copy(), np.random.default_rng(0)))


@pytest.mark.parametrize(
    "transform", [T.RandomResizedCrop(16), T.Resize(16), T.Compose([T.Resize(20), T.CenterCrop(16)])]
)
def test_crop_planners_take_grayscale_hw(transform):
    gray = np.random.default_rng(1).integers(0, 256, (40, 50), dtype=np.uint8)
    out = transform(gray, np.random.default_rng(2))
    assert out.ndim == 2 and out.dtype == np.uint8
    np.testing.assert_array_equal(out, transform(gray[..., None], np.random.default_rng(2))[..., 0])


def test_compose_misuses_say_what_to_write():
    with pytest.raises(TypeError, match=r"Compose takes a list of transforms, got RandomHorizontalFlip"):
        T.Compose(T.RandomHorizontalFlip())
    pipeline = T.Compose([T.RandomHorizontalFlip()])
    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(TypeError, match=r"called as t\(img, rng\).*fl\.WrappedDataset\(dataset, transform"):
        pipeline(img)
    with pytest.raises(TypeError, match=r"got Image \(a PIL image: np\.asarray\(img\)\)"):
        pipeline(Image.fromarray(img), np.random.default_rng(0))
    assert pipeline(img, np.random.default_rng(0)).shape == (8, 8, 3)


def test_python_m_fastload_is_the_command():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "fastload", "--version"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"fastload {fl.__version__}")


def test_torchvision_names_missing_from_fl_transforms_say_where_they_went():
    with pytest.raises(AttributeError, match=r"'Normalize' \(torchvision's Normalize: .*fl\.Loader\(\.\.\., normalize=fl\.Normalize\(mean="):
        T.Normalize  # noqa: B018
    with pytest.raises(AttributeError, match=r"'ToTensor' \(torchvision's ToTensor: drop it"):
        T.ToTensor  # noqa: B018
    with pytest.raises(AttributeError, match=r"'MixUp' \(torchvision's MixUp: fl\.augment\.MixUp"):
        T.MixUp  # noqa: B018
    assert not hasattr(T, "NoSuchTransform")


def test_image_folder_has_torchvisions_targets_and_samples(tmp_path):
    from collections import Counter

    from fastload.photos.jpegs import make_photo_dataset

    root = make_photo_dataset(str(tmp_path / "photos"), 12, num_classes=3, seed=0)
    ds = fl.ImageFolder(root)
    assert ds.targets == ds.labels.tolist() and sorted(Counter(ds.targets)) == [0, 1, 2]
    assert ds.samples[0] == (ds.path(0), ds.targets[0]) and len(ds.samples) == len(ds)
    assert all(os.path.basename(os.path.dirname(p)) == ds.classes[y] for p, y in ds.samples)


def test_a_timm_string_with_a_section_without_a_number_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'foo'"):
        fl.transforms.train(64, auto_augment="rand-m9-foo")
    with pytest.raises(ValueError, match="'bar'"):
        fl.transforms.parse_auto_augment("augmix-m5-bar")
    assert fl.transforms.parse_auto_augment("rand-m9-tweights-mstd0.5").magnitude == 9
