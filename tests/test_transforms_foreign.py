"""A torchvision (or timm) transform handed to fastload is a TypeError at construction
that names the fastload form of each of its steps."""

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
    assert f"normalizes on the device: fl.Loader(..., mean={MEAN}, std={STD})" in msg


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
