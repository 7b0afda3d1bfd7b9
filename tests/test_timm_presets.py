"""fl.transforms.train/eval with timm's arguments against timm's transforms_imagenet_train/eval."""

import cv2
import numpy as np
import pytest
import refs
from conftest import make_image
from PIL import Image

from fastload import transforms as T
from fastload.transforms.timm_policies import (
    TimmAugMix,
    TimmAutoAugment,
    TimmRandAugment,
)


@pytest.fixture(scope="module")
def factory():
    refs.timm()
    from timm.data import transforms_factory

    return transforms_factory


# Each step of timm's train transform and the fastload step doing its job.
_KINDS = {"RandomResizedCropAndInterpolation": "crop", "RandomResizedCrop": "crop", "RandomHorizontalFlip": "hflip",
          "RandomVerticalFlip": "vflip", "RandAugment": "rand", "TimmRandAugment": "rand", "AutoAugment": "auto",
          "TimmAutoAugment": "auto", "AugMixAugment": "augmix", "TimmAugMix": "augmix", "ColorJitter": "jitter",
          "RandomGrayscale": "gray", "RandomApply": "apply"}


def _kinds(steps) -> list[str]:
    return [_KINDS[type(t).__name__] for t in steps if type(t).__name__ in _KINDS]


CASES = [dict(), dict(auto_augment="rand-m9-mstd0.5-inc1", color_jitter=0.4), dict(auto_augment="augmix-m5-w4-d2"),
         dict(auto_augment="original", vflip=0.5, hflip=0.0), dict(auto_augment="3a", color_jitter=0.3),
         dict(auto_augment="v0", color_jitter=0.4, force_color_jitter=True),
         dict(color_jitter=(0.4, 0.3, 0.2, 0.1), color_jitter_prob=0.8, grayscale_prob=0.2, gaussian_blur_prob=0.5,
              vflip=0.1)]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_train_has_timms_steps_in_timms_order(factory, kw):
    timm_kw = {"color_jitter": None, **kw}
    ref = factory.transforms_imagenet_train(224, **timm_kw).transforms
    ours = T.train(224, **kw).transforms
    assert _kinds(ours) == _kinds(ref)
    pairs = list(zip([t for t in ours if type(t).__name__ in _KINDS], [t for t in ref if type(t).__name__ in _KINDS]))
    for a, b in pairs:
        if type(b).__name__ == "RandomApply":
            assert a.p == b.p
            a, b = a.transforms[0], b.transforms[0]
        if type(b).__name__ == "ColorJitter":
            for k in ("brightness", "contrast", "saturation", "hue"):
                want = getattr(b, k)
                assert (getattr(a, k) is None) == (want is None), k
                if want is not None:
                    assert np.allclose(getattr(a, k), want), k
        if type(b).__name__ in ("RandomHorizontalFlip", "RandomVerticalFlip", "RandomGrayscale"):
            assert a.p == b.p
        if type(b).__name__ == "GaussianBlur":
            assert tuple(a.kernel_size) == tuple(b.kernel_size) and np.allclose(a.sigma, b.sigma)
        if type(b).__name__ == "RandomResizedCropAndInterpolation":
            assert np.allclose(a.scale, b.scale) and np.allclose(a.ratio, b.ratio) and a.size == tuple(b.size)


def test_auto_augment_gets_timms_fill_translation_and_interpolation():
    for interp in ("bilinear", "bicubic", "random"):
        ra = T.train((224, 256), auto_augment="rand-m9", interpolation=interp).transforms[-1]
        assert isinstance(ra, TimmRandAugment)
        hp = ra.ops[0].hparams
        assert (hp.translate_const, hp.fill, hp.interpolation) == (100, (124, 116, 104), interp)
    mix = T.train(224, auto_augment="augmix-m3").transforms[-1]
    assert isinstance(mix, TimmAugMix) and mix.ops[0].hparams.translate_pct == 0.3
    assert isinstance(T.train(224, auto_augment="v0r").transforms[-1], TimmAutoAugment)


def test_train_output_is_reproducible_per_sample():
    img = make_image(3, 200, 260)
    t = T.train(96, auto_augment="rand-m9-mstd0.5-inc1")
    outs = [t(img, np.random.default_rng(s)) for s in (1, 1, 2)]
    assert outs[0].shape == (96, 96, 3) and outs[0].dtype == np.uint8
    assert np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[0], outs[2])


def test_train_rejects_what_belongs_elsewhere():
    with pytest.raises(ValueError, match=r"re_prob=0.25.*fl.augment.RandomErasing\(0.25"):
        T.train(224, re_prob=0.25)
    with pytest.raises(ValueError, match="train_crop_mode='rkrr'"):
        T.train(224, train_crop_mode="rkrr")
    with pytest.raises(ValueError, match="interpolation"):
        T.train(224, interpolation="lanczos")
    with pytest.raises(ValueError, match="unknown auto-augment 'v9'"):
        T.train(224, auto_augment="v9")


def _photo(h: int, w: int) -> np.ndarray:
    from fastload.photos.bundled import source_photos

    img = next(v for v in source_photos(gray=False).values() if v.ndim == 3)
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)


@pytest.mark.parametrize("kw", [dict(crop_pct=0.875), dict(crop_pct=0.95), dict(crop_pct=0.9, crop_mode="squash"),
                                dict(crop_pct=0.875, interpolation="bicubic"),
                                dict(crop_pct=1.0, crop_mode="squash", interpolation="bicubic"),
                                dict(crop_pct=1.0, crop_mode="border"), dict(crop_pct=0.9, crop_mode="border"),
                                dict(crop_pct=0.95, crop_mode="border", interpolation="bicubic")],
                         ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_eval_matches_timms_eval_transform_on_pillow(factory, kw):
    ref = factory.transforms_imagenet_eval(224, use_prefetcher=True, **kw)
    ours = T.eval(224, **kw)
    for h, w in ((375, 500), (480, 360), (301, 400)):  # 301x400: an odd padding in "border"
        img = _photo(h, w)
        want = ref(Image.fromarray(img)).permute(1, 2, 0).numpy()
        got = ours(img, None)
        assert got.shape == want.shape == (224, 224, 3)
        # Measured: ~0.3 levels (bilinear), ~0.01 (bicubic): the same filters, rounding.
        assert np.abs(got.astype(int) - want).mean() < 0.6, kw


def test_eval_arguments():
    assert T.eval(224).transforms[0].resize == 256
    assert T.eval(224, crop_pct=0.95).transforms[0].resize == 235  # floor(224 / 0.95), as timm
    with pytest.raises(ValueError, match="not both"):
        T.eval(224, resize=256, crop_pct=0.9)
    with pytest.raises(ValueError, match="crop_mode"):
        T.eval(224, crop_mode="letterbox")
    with pytest.raises(ValueError, match="crop_pct"):
        T.eval(224, crop_pct=1.5)
