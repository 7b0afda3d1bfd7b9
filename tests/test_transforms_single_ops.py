"""torchvision's single-operation transforms (RandomInvert, RandomPosterize, RandomEqualize,
RandomAutocontrast, RandomAdjustSharpness, Grayscale, Pad): torchvision's pixels when applied,
the image itself when not, applied with probability p, bad arguments named at construction."""

import numpy as np
import pytest
import refs
import torch
from conftest import photo_jpegs

import fastload as fl
import fastload.transforms as T
from fastload.decode import decode_image

tv = refs.torchvision()
import torchvision.transforms.v2 as V2  # noqa: E402


@pytest.fixture(scope="module")
def photo():
    return decode_image(photo_jpegs((120, 160), 1, seed=3)[0])


CASES = [
    (T.RandomInvert(p=1.0), V2.RandomInvert(p=1.0)),
    (T.RandomPosterize(3, p=1.0), V2.RandomPosterize(3, p=1.0)),
    (T.RandomEqualize(p=1.0), V2.RandomEqualize(p=1.0)),
    (T.RandomAutocontrast(p=1.0), V2.RandomAutocontrast(p=1.0)),
    (T.RandomAdjustSharpness(2.0, p=1.0), V2.RandomAdjustSharpness(2.0, p=1.0)),
    (T.Grayscale(1), V2.Grayscale(1)),
    (T.Grayscale(3), V2.Grayscale(3)),
    (T.Pad((3, 5)), V2.Pad((3, 5))),
    (T.Pad(4, padding_mode="reflect"), V2.Pad(4, padding_mode="reflect")),
    (T.Pad((1, 2, 3, 4), fill=(10, 20, 30)), V2.Pad((1, 2, 3, 4), fill=(10, 20, 30))),
]


@pytest.mark.parametrize("ours, theirs", CASES, ids=[repr(c[0]) for c in CASES])
def test_applied_they_give_torchvisions_pixels(photo, ours, theirs):
    got = ours(photo, np.random.default_rng(0))
    want = theirs(torch.from_numpy(photo).permute(2, 0, 1)).permute(1, 2, 0).numpy()
    assert got.shape == want.shape and got.dtype == np.uint8
    assert np.abs(got.astype(int) - want.astype(int)).mean() <= 0.05


@pytest.mark.parametrize("cls, args", [(T.RandomInvert, ()), (T.RandomPosterize, (2,)), (T.RandomEqualize, ()),
                                       (T.RandomAutocontrast, ()), (T.RandomAdjustSharpness, (0.0,))])
def test_applied_with_probability_p_drawn_from_the_samples_rng(photo, cls, args):
    photo = photo // 2 + 40  # low contrast: autocontrast has something to do
    never, always, half = cls(*args, p=0.0), cls(*args, p=1.0), cls(*args, p=0.3)
    rng = np.random.default_rng(1)
    assert never(photo, rng) is photo and always(photo, rng) is not photo
    applied = sum(half(photo, rng) is not photo for _ in range(2000))
    assert abs(applied / 2000 - 0.3) < 0.04  # binomial sd 0.01
    a, b = half(photo, np.random.default_rng(7)), half(photo, np.random.default_rng(7))
    assert np.array_equal(a, b)


def test_bad_arguments_are_named_at_construction():
    with pytest.raises((TypeError, ValueError), match="9"):
        T.RandomPosterize(9)
    with pytest.raises(ValueError, match="wrap"):
        T.Pad(2, padding_mode="wrap")
    with pytest.raises(ValueError, match="2"):
        T.Grayscale(2)
    with pytest.raises(ValueError, match="1.5"):
        T.RandomInvert(p=1.5)


def test_torchvisions_forms_name_them(folder):
    with pytest.raises(TypeError, match="RandomInvert -> fl.transforms.RandomInvert"):
        fl.ImageFolder(folder, transform=V2.Compose([V2.RandomInvert(), V2.Pad(2)]))
