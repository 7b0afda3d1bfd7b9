"""Every public transform and batch transform refuses inf and nan in its numeric arguments at
construction (issue 32, item 14): ``ColorJitter(brightness=inf)`` passed every range check,
then every sample failed in the workers with numpy's overflow error."""

import inspect
import math

import numpy as np
import pytest

from fastload import augment as A
from fastload import transforms as T

BAD = (math.nan, math.inf, -math.inf)

# Arguments that make each class constructible; None: takes other transforms, not numbers.
REQUIRED: dict = {
    "RandomSolarize": {"threshold": 128},
    "GaussianBlur": {"kernel_size": 3},
    "RandomCrop": {"size": 8},
    "RandomResizedCrop": {"size": 8},
    "Resize": {"size": 8},
    "CenterCrop": {"size": 8},
    "ResizedCenterCrop": {"size": 8, "resize": 10},
    "RandomPosterize": {"bits": 4},
    "RandomAdjustSharpness": {"sharpness_factor": 1.5},
    "Pad": {"padding": 2},
    "TimmOp": {"name": "Rotate"},
    "TimmAugMix": {"ops": [T.TimmOp("Rotate")]},
    "TimmRandAugment": {"ops": [T.TimmOp("Rotate"), T.TimmOp("Solarize")]},
    "TimmAutoAugment": {"policy": [[T.TimmOp("Rotate")]]},
    "RandomApply": None,
    "MultiView": None,
    "Compose": None,
    "ImagesOnly": None,
    "RandomChoice": None,
}
# Numeric arguments whose default is None, with a good value.
NUMBERS_DEFAULT_NONE = {
    "ColorJitter": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
    "Mixup": {"cutmix_minmax": (0.2, 0.8)},
    "RandomErasing": {"max_aspect": 3.0},
    "RandomCrop": {"padding": 2, "fill": 0},
    "RandAugment": {"fill": 0},
    "TrivialAugmentWide": {"fill": 0},
    "AutoAugment": {"fill": 0},
    "AugMix": {"fill": 0},
    "TimmOp": {"magnitude_max": 10.0},
    "TimmRandAugment": {"num_layers": 1, "weights": [1.0, 2.0]},
    "train": {"hflip": 0.5, "color_jitter": 0.4, "color_jitter_prob": 0.5},
    "eval": {"crop_pct": 0.9},
}
# Non-finite values with a meaning: timm's magnitude_std=inf draws the magnitude uniformly.
MEANINGFUL = {("TimmOp", "magnitude_std", math.inf)}
NOT_ARGUMENT_CLASSES = {"Crop", "DecodeSteps", "ViewSteps", "AutoAugmentPolicy", "BatchTransforms", "MixParams",
                        "CropPlanner"}


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad_variants(good):
    """``good`` with one number replaced by each non-finite value."""
    if _numeric(good):
        return list(BAD)
    if isinstance(good, (tuple, list)) and good and all(_numeric(v) for v in good):
        return [type(good)([*good[:i], bad, *good[i + 1:]]) for i in range(len(good)) for bad in BAD]
    return []


def _constructors():
    for module in (T, A):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and name not in NOT_ARGUMENT_CLASSES:
                yield name, obj
    yield "train", T.train
    yield "eval", T.eval


def _cases():
    cases = []
    for name, make in _constructors():
        if name in REQUIRED and REQUIRED[name] is None:
            continue
        base = {**REQUIRED.get(name, {}), **NUMBERS_DEFAULT_NONE.get(name, {})}
        params = inspect.signature(make).parameters
        missing = [p for p, v in params.items() if v.default is inspect.Parameter.empty
                   and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD) and p not in base]
        assert not missing, f"{name} needs {missing}: add working values to REQUIRED in this test"
        for arg, p in params.items():
            good = base.get(arg, p.default)
            for bad in _bad_variants(good):
                if not (_numeric(bad) and (name, arg, bad) in MEANINGFUL):
                    cases.append(pytest.param(make, base, arg, bad, id=f"{name}-{arg}-{bad!r}"))
    return cases


CASES = _cases()


def test_every_public_transform_is_probed():
    probed = {c.id.split("-")[0] for c in CASES}
    assert {"ColorJitter", "GaussianBlur", "RandomResizedCrop", "RandomErasing", "Mixup", "MixUp", "CutMix",
            "AugMix", "TimmOp", "RandomAdjustSharpness", "Pad", "train", "eval"} <= probed
    assert len(CASES) > 100


@pytest.mark.parametrize("make,base,arg,bad", CASES)
def test_a_non_finite_number_is_refused_at_construction_naming_its_argument(make, base, arg, bad):
    # An argument that must be an int may say so with a TypeError.
    with pytest.raises((ValueError, TypeError), match=arg):
        make(**{**base, arg: bad})


def test_color_jitter_of_inf_fails_at_once_not_in_every_sample():
    with pytest.raises(ValueError, match="brightness must be finite, got"):
        T.ColorJitter(brightness=math.inf)
    with pytest.raises(ValueError, match="color_jitter must be finite|brightness must be finite"):
        T.train(32, color_jitter=math.inf)
    jitter = T.ColorJitter(brightness=0.4)  # finite values still work
    img = np.full((8, 8, 3), 100, np.uint8)
    assert jitter(img, np.random.default_rng(0)).shape == (8, 8, 3)


def test_timm_uniform_magnitude_noise_stays_allowed():
    op = T.TimmOp("Rotate", magnitude=9, magnitude_std=math.inf)
    assert 0 <= op.draw_magnitude(np.random.default_rng(0)) <= 9
    T.train(32, auto_augment="rand-m9-mstd101")  # timm reads mstd > 100 as inf
