"""A torchvision (or timm) transform handed to fastload is a TypeError at construction
that names the fastload form of each of its steps."""

import warnings

import numpy as np
import pytest
import refs

import fastload as fl

tv = refs.torchvision()
import torchvision.transforms as V1  # noqa: E402
import torchvision.transforms.v2 as V2  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def error_for(folder, transform):
    with pytest.raises(TypeError) as info:
        fl.ImageFolder(folder, transform=transform)
    return str(info.value)


def test_torchvision_compose_names_each_steps_equivalent(folder):
    msg = error_for(folder, V1.Compose([V1.RandomResizedCrop(224), V1.ColorJitter(0.4, 0.4, 0.4), V1.ToTensor(),
                                        V1.Normalize(MEAN, STD)]))
    assert "uint8 H×W×C numpy array" in msg
    assert "RandomResizedCrop -> fl.transforms.RandomResizedCrop" in msg
    assert "ColorJitter -> fl.transforms.ColorJitter" in msg
    assert "ToTensor -> drop it: the Loader makes the tensor on the device" in msg
    advice = f"fl.Loader(..., normalize=fl.Normalize(mean={MEAN}, std={STD}))"
    assert f"normalizes on the device: {advice}" in msg
    assert "fl.Loader(ds, normalize=fl.Normalize(mean=..., std=...))." in msg


def test_the_normalize_advice_is_the_current_spelling(folder):
    """What the errors tell a torchvision user to write is taken without a DeprecationWarning
    (mean= and std= on the Loader are the old spelling)."""
    ds = fl.ImageFolder(folder, transform=fl.transforms.eval(32))
    msg = error_for(folder, V1.Normalize(MEAN, STD))
    call = msg.split("normalizes on the device: ")[1].splitlines()[0]
    assert call.startswith("fl.Loader(..., ") and call.endswith(")"), call
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a DeprecationWarning fails the test
        loader = eval(call.replace("...", "ds, batch_size=2, num_workers=0", 1), {"fl": fl, "ds": ds})
    with loader:
        assert loader.config.normalize == fl.Normalize(mean=MEAN, std=STD)
    with pytest.raises(AttributeError, match=r"normalize=fl\.Normalize\(mean=\.\.\., std=\.\.\.\)\)"):
        fl.transforms.Normalize  # noqa: B018


def test_v2_batch_level_and_unknown_steps(folder):
    msg = error_for(folder, V2.Compose([V2.ToImage(), V2.RandomErasing(), V2.Lambda(lambda x: x),
                                        V2.TrivialAugmentWide()]))
    assert "RandomErasing -> fl.augment.RandomErasing" in msg and "batch_transform=" in msg
    assert "Lambda -> no fastload equivalent" in msg
    assert "TrivialAugmentWide -> fl.transforms.TrivialAugmentWide" in msg
    assert "ToImage -> drop it" in msg


def test_single_transform_and_in_a_list(folder):
    assert "RandAugment -> fl.transforms.RandAugment" in error_for(folder, V2.RandAugment())
    msg = error_for(folder, [fl.transforms.RandomResizedCrop(64), V1.RandomHorizontalFlip()])
    assert "RandomHorizontalFlip -> fl.transforms.RandomHorizontalFlip" in msg


def test_timm_transform(folder):
    timm = refs.timm()
    from timm.data.transforms import RandomResizedCropAndInterpolation

    msg = error_for(folder, RandomResizedCropAndInterpolation(224))
    assert "timm transform" in msg and "fl.transforms.RandomResizedCrop" in msg
    del timm


def test_fastload_and_plain_callables_are_still_accepted(folder):
    ds = fl.ImageFolder(folder, transform=[fl.transforms.RandomResizedCrop(32), fl.transforms.RandAugment(),
                                           lambda img: np.ascontiguousarray(img)])
    img, _ = ds.load(0)
    assert img.shape == (32, 32, 3)
