"""A fastload transform's setting changed in place counts as if given to its constructor
(fastload/transforms/settings.py): checked, normalized, and what the transform derives from
it derived again; a list a pipeline holds, changed in place, is seen as it runs. Before, a
transform that derived state when made (ColorJitter's operations, a single op's function,
RandomApply's pipeline, a Compose's call forms) went on with the old setting, in this process
and in the persistent workers replaced for the change."""

import warnings

import numpy as np
import pytest
from conftest import write_folder

import fastload as fl
import fastload.transforms as T
from fastload.transforms.presets import BicubicCenterCrop, BorderCenterCrop, SquashCenterCrop
from fastload.transforms.settings import Settings
from fastload.transforms.timm_policies import TimmOp


class Aug:
    """An albumentations-like pipeline: ``aug(image=img)["image"]``."""

    def __init__(self, add):
        self.add = add

    def __call__(self, image):
        return {"image": image + np.uint8(self.add)}

    def __repr__(self):
        return f"Aug({self.add})"


CHANGED = "changed since its persistent worker processes copied it"

# (class, constructor arguments, other arguments to set one by one, in this order)
CASES = [
    (T.ColorJitter, dict(brightness=0.1), dict(brightness=0.6, contrast=(0.5, 1.5), saturation=0.3, hue=0.2)),
    (T.RandomPosterize, dict(bits=8, p=1.0), dict(bits=2)),
    (T.RandomAdjustSharpness, dict(sharpness_factor=1.0, p=1.0), dict(sharpness_factor=3.0)),
    (T.RandomInvert, dict(p=0.0), dict(p=1.0)),
    (T.RandomEqualize, dict(p=0.0), dict(p=1.0)),
    (T.RandomAutocontrast, dict(p=0.0), dict(p=1.0)),
    (T.Grayscale, dict(num_output_channels=1), dict(num_output_channels=3)),
    (T.Pad, dict(padding=1), dict(padding=(2, 3), fill=9, padding_mode="constant")),
    (T.RandomApply, dict(transforms=[T.RandomInvert(p=1.0)], p=0.0), dict(p=1.0, transforms=[T.RandomPosterize(2, 1.0)])),
    (T.RandomGrayscale, dict(p=0.0), dict(p=1.0)),
    (T.RandomSolarize, dict(threshold=255, p=1.0), dict(threshold=100, p=1.0)),
    (T.GaussianBlur, dict(kernel_size=3), dict(kernel_size=5, sigma=(1.0, 2.0))),
    (T.RandomHorizontalFlip, dict(p=0.0), dict(p=1.0)),
    (T.RandomVerticalFlip, dict(p=0.0), dict(p=1.0)),
    (T.CenterCrop, dict(size=20), dict(size=12)),
    (T.RandomCrop, dict(size=20), dict(size=12, padding=2, fill=7)),
    (T.RandomResizedCrop, dict(size=20), dict(size=12, scale=(0.5, 1.0), ratio=(0.9, 1.1), antialias=False)),
    (T.Resize, dict(size=20), dict(size=12, antialias=False)),
    (T.ResizedCenterCrop, dict(size=12, resize=20), dict(resize=16, size=8, antialias=False)),
    (T.RandAugment, dict(num_ops=1, magnitude=1), dict(num_ops=3, magnitude=20, num_magnitude_bins=31)),
    (T.TrivialAugmentWide, dict(num_magnitude_bins=31), dict(num_magnitude_bins=5)),
    (T.AutoAugment, dict(), dict(policy=T.AutoAugmentPolicy.SVHN)),
    (T.AugMix, dict(severity=1), dict(severity=8, mixture_width=2, chain_depth=2, alpha=0.5)),
    (TimmOp, dict(name="Invert", prob=0.0), dict(name="Posterize", prob=1.0, magnitude=8)),
    (T.TimmRandAugment, dict(ops=[TimmOp("Invert", 1.0)]), dict(ops=[TimmOp("Solarize", 1.0, 9)], num_layers=1)),
    (T.TimmAugMix, dict(ops=[TimmOp("Invert", 1.0)]), dict(ops=[TimmOp("Posterize", 1.0, 8)], width=2, depth=2)),
    (T.TimmAutoAugment, dict(policy=[[TimmOp("Invert", 1.0)]]), dict(policy=[[TimmOp("Equalize", 1.0)]])),
    (T.Compose, dict(transforms=[T.CenterCrop(20)]), dict(transforms=[T.RandomResizedCrop(12), T.RandomInvert(1.0)])),
    (SquashCenterCrop, dict(size=12, resize=20), dict(size=8, resize=(16, 18), antialias=False)),
    (BorderCenterCrop, dict(size=12, resize=20, fill=(0, 0, 0)), dict(size=16, resize=14, fill=(9, 9, 9))),
    (BicubicCenterCrop, dict(size=12, resize=20), dict(size=8, resize=(16, 18))),
    (T.Albumentations, dict(aug=Aug(1)), dict(aug=Aug(7))),
    (T.MultiView, dict(pipelines=[[T.CenterCrop(20)], [T.CenterCrop(8)]]),
     dict(pipelines=[[T.RandomResizedCrop(12)], [T.CenterCrop(4)]], counts=[2, 3], reduced_decode=False)),
]


def _image():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (24, 28, 3), dtype=np.uint8)


def _out(t):
    rng = np.random.default_rng(5)
    if isinstance(t, (T.Resize, T.ResizedCenterCrop, T.RandomResizedCrop, SquashCenterCrop)):
        return t.plan(24, 28, rng)
    return t(_image(), rng)


def _public(t):
    return {k: v for k, v in vars(t).items() if not k.startswith("_")}


def _same(a, b):
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _subclasses(cls):
    return {cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))}


def test_every_transform_is_covered():
    """Every transform class fastload exports is a Settings (so a setting set in place takes
    effect), and every Settings of fastload's is in CASES."""
    exported = {getattr(T, n) for n in T.__all__ if isinstance(getattr(T, n), type)}
    not_transforms = {T.AutoAugmentPolicy, T.Crop, T.DecodeSteps, T.ViewSteps}
    assert all(issubclass(c, Settings) for c in exported - not_transforms), exported - not_transforms
    ours = {c for c in _subclasses(Settings) if c.__module__.startswith("fastload.") and c is not Settings}
    bases = {c for c in ours if c.__name__.startswith("_") or c.__name__ in ("DecodePipeline", "InPlace", "CropPlanner")}
    assert ours - bases == {c for c, _, _ in CASES}


@pytest.mark.parametrize("cls, made, later", CASES, ids=[c.__name__ for c, _, _ in CASES])
def test_a_setting_set_in_place_is_as_if_given_to_the_constructor(cls, made, later):
    t = cls(**made)
    for name, value in later.items():
        setattr(t, name, value)
    fresh = cls(**{**made, **later})
    assert repr(_public(t)) == repr(_public(fresh)), "the settings, normalized as the constructor does"
    assert _same(_out(t), _out(fresh)), "what it does: the new settings'"


@pytest.mark.parametrize("t, name, bad", [
    (T.ColorJitter(brightness=0.2), "brightness", -1),
    (T.RandomResizedCrop(16), "scale", (0.9, 0.1)),
    (T.RandomPosterize(4), "bits", 9),
    (T.Compose([T.CenterCrop(8)]), "transforms", 3),
    (T.ResizedCenterCrop(8, 10), "size", 12),  # larger than the resize
])
def test_a_bad_setting_raises_the_constructors_error_and_changes_nothing(t, name, bad):
    before = repr(_public(t))
    with pytest.raises((ValueError, TypeError)):
        setattr(t, name, bad)
    assert repr(_public(t)) == before


def test_other_attributes_are_set_as_they_are():
    t = T.ColorJitter(brightness=0.2)
    t.note = "mine"
    t.brightness = 0.4
    assert t.note == "mine" and t.brightness == (0.6, 1.4)


def test_a_pipelines_list_changed_in_place_is_seen_as_it_runs():
    img = _image()
    pipe = T.Compose([T.CenterCrop(20)])
    pipe.transforms.append(lambda x: 255 - x)  # f(img): called without the rng
    assert np.array_equal(pipe(img, np.random.default_rng(0)), 255 - img[2:22, 4:24])
    pipe.transforms[1] = T.RandomPosterize(1, p=1.0)  # f(img, rng)
    assert np.array_equal(pipe(img, np.random.default_rng(0)), img[2:22, 4:24] & 0x80)
    applied = T.RandomApply([T.RandomInvert(1.0)], p=1.0)
    applied.transforms[0] = T.RandomPosterize(1, p=1.0)
    assert np.array_equal(applied(img, np.random.default_rng(0)), img & 0x80)
    pipe.transforms.append(3)
    with pytest.raises(TypeError):
        pipe(img, np.random.default_rng(0))


def test_a_multiviews_transforms_are_its_pipelines_read_only():
    views = T.MultiView([[T.CenterCrop(8)], [T.CenterCrop(6)]])
    views.pipelines = [[T.CenterCrop(8)], [T.CenterCrop(4)]]
    views.counts = [1, 2]
    assert views.num_views == 3 and [p.transforms[0].size for p in views.transforms] == [(8, 8), (4, 4)]
    with pytest.raises(ValueError, match="counts must be a sequence of 1 ints"):
        views.pipelines = [[T.CenterCrop(8)]]  # counts (1, 2) name two pipelines: set a new MultiView
    with pytest.raises(AttributeError):
        views.transforms = []


@pytest.mark.parametrize("backend, workers", [("process", 2), ("thread", 2), ("process", 0)])
def test_a_setting_changed_in_place_between_epochs_takes_effect(tmp_path, backend, workers):
    """The case seen: RandomPosterize derived its function from ``bits`` when made, so
    ``bits = 1`` set between epochs changed nothing (persistent workers were replaced with a
    warning, and made the old bits all the same)."""
    posterize = T.RandomPosterize(8, p=1.0)
    ds = fl.ImageFolder(write_folder(tmp_path, num_classes=1, per_class=4), transform=[T.CenterCrop(16), posterize])
    loader = fl.Loader(ds, batch_size=4, num_workers=workers, backend=backend, device="cpu", normalize=False,
                       shuffle=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = [images.clone() for images, _ in loader]
        posterize.bits = 1
        second = [images.clone() for images, _ in loader]
    loader.close()
    said = [str(w.message) for w in caught if CHANGED in str(w.message)]
    assert len(said) == (1 if backend == "process" and workers else 0), said
    assert len(first) == len(second) == 1
    assert (first[0] != first[0] & 0x80).any(), "bits=8 keeps the image"
    assert (second[0] == first[0] & 0x80).all(), "bits=1 keeps each level's top bit"


def test_settings_set_together_from_two_threads_are_both_kept():
    import sys
    import threading

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside a setting's rebuild, as on a busy machine
    try:
        _both_kept(threading)
    finally:
        sys.setswitchinterval(previous)


def _both_kept(threading):
    for _ in range(300):
        t = T.ColorJitter(brightness=0.1, contrast=0.1)
        start = threading.Barrier(2)

        def set_(name, t=t, start=start):
            start.wait()
            setattr(t, name, 0.3)

        threads = [threading.Thread(target=set_, args=(n,)) for n in ("brightness", "contrast")]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert t.brightness == t.contrast == (0.7, 1.3)


def test_a_list_setting_left_as_it_was_stays_the_callers():
    pipe = T.Compose([T.CenterCrop(8)])
    held = pipe.transforms
    pipe.reduced_decode = False
    assert pipe.transforms is held
    held.append(T.RandomInvert(1.0))
    assert pipe(_image(), np.random.default_rng(0)).max() <= 255 and len(pipe._forms()[0]) == 2


def test_a_pipelines_own_reduced_decode_set_in_place_counts_in_a_multiview():
    views = T.MultiView([T.train(16), T.train(8)])
    assert views._reduced()
    views.pipelines[0].reduced_decode = False
    assert not views._reduced()
    with pytest.raises(TypeError):
        views.transforms[0] = T.train(16)  # a tuple: set pipelines instead


def test_numpy_values_are_taken_as_the_constructor_takes_them():
    applied = T.RandomApply([T.RandomInvert(1.0)], p=np.float32(0.25))
    assert applied.p == 0.25
    crop = T.RandomResizedCrop(np.array([16, 12]))
    crop.size = np.array([8, 8])
    assert crop.size == (8, 8)


class _Scaled:
    """A user's mixin that sets a setting of the fastload transform it is mixed into."""

    def __init__(self, brightness=0.5):
        super().__init__(brightness=brightness)
        self.brightness = brightness


class _Mixed(_Scaled, T.ColorJitter):
    pass


class _Doubled(T.RandomResizedCrop):
    """A user's subclass that stores its own value under an argument's name."""

    def __init__(self, size):
        super().__init__(size * 2)


def test_a_users_subclass_is_set_as_before():
    mixed = _Mixed(0.5)  # before: made again from within its own constructor, for ever
    assert mixed.brightness == 0.5
    doubled = _Doubled(8)
    doubled.scale = (0.6, 1.0)  # set as it is: no constructor of its to call with (16, 16)
    assert doubled.scale == (0.6, 1.0) and doubled.size == (16, 16)
