import io
import math

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from fastload import transforms as T
from fastload.datasets.base import sample_rng
from fastload.decode import get_decoder, image_size
from fastload.decode.resize import resize, resize_window

from conftest import jpeg_bytes, make_image, photo_jpegs


def test_random_resized_crop_geometry_follows_torchvision_ranges():
    rrc = T.RandomResizedCrop(224)
    areas, ratios = [], []
    for i in range(2000):
        c = rrc.plan(375, 500, np.random.default_rng(i))
        assert 0 <= c.top and c.top + c.height <= 375 and 0 <= c.left and c.left + c.width <= 500
        assert (c.out_h, c.out_w) == (224, 224)
        areas.append(c.height * c.width / (375 * 500))
        ratios.append(c.width / c.height)
    areas, ratios = np.array(areas), np.array(ratios)
    assert areas.min() >= 0.07 and areas.max() <= 1.0
    assert ratios.min() >= 0.74 and ratios.max() <= 1.35
    assert 0.35 < np.median(areas) < 0.65  # uniform in [0.08, 1] with some rejections
    assert abs(np.median(np.log(ratios))) < 0.05  # log-uniform, centred on 1


def test_random_resized_crop_falls_back_to_centre():
    # A 10x1000 strip admits no crop with ratio in [3/4, 4/3] and area >= 8%.
    c = T.RandomResizedCrop(32).plan(10, 1000, np.random.default_rng(0))
    assert (c.height, c.width) == (10, round(10 * 4 / 3))
    assert c.left == (1000 - c.width) // 2 and c.top == 0


def test_same_rng_same_output_and_different_seed_differs():
    img = make_image(3, 200, 260)
    t = T.train(64)
    a = t(img, sample_rng(0, 1, 5))
    b = t(img, sample_rng(0, 1, 5))
    c = t(img, sample_rng(0, 2, 5))
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_flip_is_exact_mirror():
    img = make_image(4, 20, 30)
    flip = T.RandomHorizontalFlip(p=1.0)
    assert np.array_equal(flip(img, np.random.default_rng(0)), img[:, ::-1])
    assert T.RandomHorizontalFlip(p=0.0)(img, np.random.default_rng(0)) is img


def test_resize_then_center_crop_matches_fused_crop():
    img = make_image(5, 300, 400)
    two_step = T.CenterCrop(224)(T.Resize(256)(img, None), None)
    composed = T.Compose([T.Resize(256), T.CenterCrop(224)])
    assert isinstance(composed.transforms[0], T.ResizedCenterCrop)
    fused = composed(img, np.random.default_rng(0))
    assert fused.shape == two_step.shape == (224, 224, 3)
    assert np.abs(fused.astype(int) - two_step).mean() < 3


def test_resize_shorter_side_keeps_aspect():
    assert T.Resize(256)(make_image(6, 300, 400), None).shape == (256, 341, 3)
    assert T.Resize(256)(make_image(6, 400, 300), None).shape == (341, 256, 3)
    assert T.Resize([256])(make_image(6, 400, 300), None).shape == (341, 256, 3)  # torchvision: one element


def test_resize_to_a_pair_is_that_size_as_torchvisions_on_real_photos():
    """torchvision's Resize((h, w)) resizes to exactly (h, w) (before, fastload took h as the
    shorter side and dropped w): Pillow's antialiased bilinear resize of the whole photo."""
    blobs = photo_jpegs((256, 512), 1, seed=11, originals=True)[:6]
    dec = get_decoder()
    for b in blobs:
        out = T.Compose([T.Resize((120, 200))], reduced_decode=False).decode(b, dec, np.random.default_rng(0))
        with Image.open(io.BytesIO(b)) as img:
            ref = np.asarray(img.convert("RGB").resize((200, 120), Image.Resampling.BILINEAR))
        assert out.shape == ref.shape == (120, 200, 3)
        assert np.abs(out.astype(np.int16) - ref).mean() < 0.5
    squash = T.Compose([T.Resize((240, 260)), T.CenterCrop(224)])
    assert isinstance(squash.transforms[0], T.Resize), "not fused as a shorter-side resize"
    assert squash(make_image(6, 300, 500), np.random.default_rng(0)).shape == (224, 224, 3)


def test_reduced_decode_pipeline_matches_full_decode():
    """Planning from the header and decoding at a DCT scale gives the same picture."""
    img = make_image(7, 480, 640)
    data = jpeg_bytes(img, quality=95)
    dec = get_decoder()
    for pipeline in (T.eval(64, resize=73), T.train(64)):
        reduced = pipeline.decode(data, dec, sample_rng(0, 0, 1))
        full = pipeline(dec.decode(data), sample_rng(0, 0, 1))
        assert reduced.shape == full.shape == (64, 64, 3)
        assert np.abs(reduced.astype(int) - full).mean() < 6


def test_eval_preset_matches_pillow_reference():
    img = make_image(8, 300, 420)
    out = T.eval(224)(img, None)
    pil = Image.fromarray(img)
    w = int(256 * 420 / 300)
    ref = np.asarray(pil.resize((w, 256), Image.Resampling.BILINEAR))
    top, left = round((256 - 224) / 2), round((w - 224) / 2)
    ref = ref[top : top + 224, left : left + 224]
    assert np.abs(out.astype(int) - ref).mean() < 3


@pytest.mark.parametrize("bad", [0, -3, (1, 2, 3), "224", 1.5])
def test_bad_sizes_are_rejected(bad):
    with pytest.raises(ValueError, match="size"):
        T.RandomResizedCrop(bad)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="scale"):
        T.RandomResizedCrop(8, scale=(0.9, 0.1))
    with pytest.raises(ValueError, match="p must be"):
        T.RandomHorizontalFlip(1.5)
    with pytest.raises(ValueError, match="larger than the resize"):
        T.eval(224, resize=200)
    with pytest.raises(TypeError, match="not callable"):
        T.Compose([42])
    with pytest.raises(ValueError, match="larger than"):
        T.CenterCrop(50)(make_image(0, 20, 20))


def test_min_scale_means_crop_still_covers_output():
    c = T.RandomResizedCrop(224).plan(2000, 3000, np.random.default_rng(1))
    s = c.min_scale
    assert c.height * s >= 224 - 1e-6 and c.width * s >= 224 - 1e-6
    assert math.isclose(max(224 / c.height, 224 / c.width), s)


# --- antialiased resizing against Pillow ---------------------------------------------------


def _pillow_eval(data: bytes, size: int = 224, resize: int = 256) -> np.ndarray:
    """torchvision v1 on PIL: Resize(resize) (Pillow's antialiased bilinear), CenterCrop(size)."""
    with Image.open(io.BytesIO(data)) as img:
        w, h = img.size
        rh, rw = (resize, int(resize * w / h)) if h <= w else (int(resize * h / w), resize)
        full = np.asarray(img.convert("RGB").resize((rw, rh), Image.Resampling.BILINEAR))
    top, left = int(round((rh - size) / 2.0)), int(round((rw - size) / 2.0))
    return full[top : top + size, left : left + size]


@pytest.mark.parametrize("short_sides", [(256, 512), (600, 1500)], ids=["imagenet-like", "large"])
def test_eval_preset_matches_pillow_on_real_photos(short_sides):
    blobs = photo_jpegs(short_sides, 3, seed=short_sides[0], originals=True)
    dec, pipeline = get_decoder(), T.eval(224)
    diffs = np.array([np.abs(pipeline.decode(b, dec, None).astype(np.int16) - _pillow_eval(b)).mean() for b in blobs])
    # Measured: 0.005 / 0.16 (imagenet-like), 0.14 / 0.4 (large: DCT-reduced decodes).
    assert diffs.mean() <= 1.5 and diffs.max() <= 5, (diffs.mean(), diffs.max())
    if short_sides[0] > 512:
        assert any(T.eval(224).plan(*image_size(b), None).decode_scale <= 0.5 for b in blobs), "no reduced decode"


def test_random_resized_crop_is_pillows_crop_then_antialiased_resize():
    blobs = photo_jpegs((256, 512), 1, seed=7, originals=True)[:12]
    dec, rrc = get_decoder(), T.RandomResizedCrop(224, scale=(0.25, 1.0))
    diffs = []
    for i, b in enumerate(blobs):
        c = rrc.plan(*image_size(b), np.random.default_rng(i))  # whole pixels, as torchvision's
        out = T.Compose([rrc], reduced_decode=False).decode(b, dec, np.random.default_rng(i))
        with Image.open(io.BytesIO(b)) as img:
            box = (c.left, c.top, c.left + c.width, c.top + c.height)
            ref = np.asarray(img.convert("RGB").crop(box).resize((224, 224), Image.Resampling.BILINEAR))
        diffs.append(np.abs(out.astype(np.int16) - ref).mean())
    assert np.mean(diffs) < 0.2 and np.max(diffs) < 0.5, diffs


def test_antialias_removes_moire_and_false_keeps_opencv_bilinear():
    stripes = np.zeros((300, 300, 3), np.uint8)
    stripes[:, ::2] = 255  # the finest detail there is: aliases when shrunk, here by 1.76x
    smooth = T.Resize(170)(stripes, None)
    aliased = T.Resize(170, antialias=False)(stripes, None)
    assert smooth.std() < 8 and aliased.std() > 40  # measured 4.2 and 73.5
    assert np.array_equal(aliased, cv2.resize(stripes, (170, 170), interpolation=cv2.INTER_LINEAR))
    assert "antialias=False" in repr(T.eval(224, antialias=False).transforms[0])
    assert not T.train(antialias=False).transforms[0].antialias


@pytest.mark.parametrize("pipeline", [T.eval(64, resize=73), T.train(64), T.eval(64, antialias=False),
                                      T.train(64, antialias=False)], ids=repr)
def test_decode_writes_into_the_batch_slot(pipeline):
    data = jpeg_bytes(make_image(9, 300, 420))
    slot = np.zeros((2, 64, 64, 3), np.uint8)[1]
    got = pipeline.decode(data, get_decoder(), sample_rng(0, 0, 3), out=slot)
    assert got is slot
    assert np.array_equal(got, pipeline.decode(data, get_decoder(), sample_rng(0, 0, 3)))


def test_resize_into_dst_and_window_equals_whole_resize_cropped():
    img = make_image(10, 211, 317)
    dst = np.empty((100, 150, 3), np.uint8)
    assert resize(img, 100, 150, dst=dst) is dst and np.array_equal(dst, resize(img, 100, 150))
    whole = resize(img, 160, 240)
    window = resize_window(img, 20 * 211 / 160, 30 * 317 / 240, 100 * 211 / 160, 150 * 317 / 240, 100, 150)
    assert np.array_equal(window, whole[20:120, 30:180])


# --- your own transforms ----------------------------------------------------------------


def _invert(img):
    return 255 - img


class _Shift:
    def __call__(self, img, rng=None):
        return np.roll(img, 1, axis=1)


def test_signature_decides_how_a_transform_is_called():
    assert not T.takes_rng(_invert) and not T.takes_rng(lambda img: img) and not T.takes_rng(np.fliplr)
    assert T.takes_rng(lambda img, rng: img) and T.takes_rng(_Shift()) and T.takes_rng(T.CenterCrop(4))
    assert not T.takes_rng(cv2.bitwise_not)  # no readable signature: one argument


def test_one_argument_transforms_run_as_they_are(folder):
    import fastload as fl

    tf = T.Compose([T.RandomResizedCrop(16), _invert, lambda img: img[::-1], _Shift()])
    ds = fl.ImageFolder(folder, transform=tf)
    plain = fl.ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(16)]))
    img, _ = ds.load(3, epoch=1, seed=2)
    want = np.roll((255 - plain.load(3, epoch=1, seed=2)[0])[::-1], 1, axis=1)
    assert np.array_equal(img, want)
    with fl.Loader(ds, batch_size=6, num_workers=2, device="cpu", normalize=False, seed=0) as loader:
        x, _ = next(iter(loader))
    assert np.array_equal(x[3].permute(1, 2, 0).numpy(), ds.load(3, epoch=0)[0])


def test_albumentations_pipeline_through_the_adapter_is_reproducible(folder, monkeypatch):
    monkeypatch.setenv("NO_ALBUMENTATIONS_UPDATE", "1")
    A = pytest.importorskip("albumentations")
    import fastload as fl

    aug = A.Compose([A.HorizontalFlip(p=0.5), A.RandomBrightnessContrast(p=1.0), A.Rotate(limit=20, p=1.0)])
    with pytest.raises(TypeError, match=r"wrap it as fl.transforms.albumentations\(aug\)"):
        T.Compose([T.RandomResizedCrop(32), aug])
    ds = fl.ImageFolder(folder, transform=[T.RandomResizedCrop(32), T.albumentations(aug)])
    a, b = ds.load(5, epoch=0, seed=1)[0], ds.load(5, epoch=0, seed=1)[0]
    assert np.array_equal(a, b), "same (seed, epoch, index), same augmentation"
    assert not np.array_equal(a, ds.load(5, epoch=1, seed=1)[0])
    opts = dict(batch_size=8, shuffle=True, device="cpu", normalize=False, seed=0)
    with fl.Loader(ds, num_workers=2, backend="process", **opts) as p, \
            fl.Loader(ds, num_workers=2, backend="thread", **opts) as t:
        for (px, py), (tx, ty) in zip(p, t):
            assert torch.equal(px, tx) and torch.equal(py, ty)


def test_a_sample_is_flipped_in_place_contiguous_and_exact(folder):
    """ds[i] and load() flip the freshly resized crop in place (cv2.flip into itself): a
    contiguous array, the exact mirror of the unflipped sample, not a negative-stride view
    whose copy in __getitem__ or collate costs ~100 µs."""
    from fastload import ImageFolder

    flipped = ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(1.0)]))
    plain = ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(0.0)]))
    for i in range(4):
        img, _ = flipped.load(i, 3)
        assert img.flags.c_contiguous and img.strides[1] == 3
        assert np.array_equal(img, plain.load(i, 3)[0][:, ::-1])


def test_an_already_decoded_region_is_not_flipped_in_place():
    """finish_decode with pixels (a batched region decode's array) leaves them as they were."""
    data = jpeg_bytes(make_image(3, 96, 128))
    dec = get_decoder()
    pipeline = T.Compose([T.RandomResizedCrop((96, 128), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3)),
                          T.RandomHorizontalFlip(1.0)])
    rng = np.random.default_rng(0)
    steps = pipeline.plan_decode(data, dec, rng)
    pixels = dec.decode(data)
    before = pixels.copy()
    out = pipeline.finish_decode(data, dec, steps, rng, pixels=pixels)
    assert np.array_equal(pixels, before)
    assert np.array_equal(out, before[:, ::-1])


def test_flips_run_in_place_beside_a_users_transform():
    """Compose decides once which transforms run in place: fastload's flip still writes into
    the batch slot after a user's transform that hands the image on as it is, and the user's
    transform is called as a transform (a method of its own named apply_inplace is not used)."""
    data = jpeg_bytes(make_image(3, 96, 128))
    dec = get_decoder()

    class Same:
        def __init__(self):
            self.calls = []

        def __call__(self, img, rng):
            self.calls.append("call")
            return img

        def apply_inplace(self, img, rng):
            self.calls.append("apply_inplace")
            return img

    user = Same()
    pipeline = T.Compose([T.RandomResizedCrop(32), user, T.RandomHorizontalFlip(1.0)])
    out = np.zeros((32, 32, 3), np.uint8)
    img = pipeline.decode(data, dec, np.random.default_rng(0), out=out)
    assert img is out and user.calls == ["call"]
    unflipped = T.Compose([T.RandomResizedCrop(32)]).decode(data, dec, np.random.default_rng(0))
    assert np.array_equal(out, unflipped[:, ::-1])


@pytest.mark.parametrize("backend, costed", [("simplejpeg", True), ("opencv", False), ("pillow", False)])
def test_only_a_decoder_with_dct_scales_gets_a_cost_plan(backend, costed):
    """A decoder's ``scales`` decide whether the cost planner plans its JPEGs (libjpeg-turbo's
    eight) or it picks its own power-of-2 scale (OpenCV's, Pillow's: none)."""
    dec = get_decoder(backend)
    data = jpeg_bytes(make_image(3, 96, 128))
    pipeline = T.Compose([T.RandomResizedCrop(32)])
    steps = pipeline.plan_decode(data, dec, np.random.default_rng(0))
    assert (steps.plan is not None) == costed and bool(dec.scales) == costed
    assert pipeline.finish_decode(data, dec, steps, np.random.default_rng(1)).shape == (32, 32, 3)
