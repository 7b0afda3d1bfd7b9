"""timm's auto-augment strings and policies against timm 1.0 itself (test-only reference).

Parsing: every field timm's factories set, string by string. Pixels: each op against the
PIL call timm makes, on real photos. Randomness: op choice, per-op probability and
argument distributions against timm's own objects (their image functions replaced by
recorders), by chi-square and Kolmogorov-Smirnov tests at p > 1e-3.
"""

import math
from collections import Counter

import cv2
import numpy as np
import pytest
import refs
from PIL import Image

from fastload.photos.bundled import source_photos
from fastload.transforms import timm_ops as O
from fastload.transforms.timm_config import (
    AugMixConfig,
    AutoConfig,
    RandConfig,
    parse_auto_augment,
)
from fastload.transforms.timm_levels import OPS, Hparams, OpSpec
from fastload.transforms.timm_policies import (
    TimmAugMix,
    TimmAutoAugment,
    TimmOp,
    TimmRandAugment,
    timm_augment,
)

def _stats():
    return pytest.importorskip("scipy.stats", reason="scipy (the dev extra) runs the statistical tests")


STRINGS = ["rand-m9-mstd0.5-inc1", "rand-m9-n3-mstd0.5-mmax10-p0.5", "rand-m7-mstd101", "rand-tweights-m5",
           "rand-m6-t3aw-n3", "rand-t3a", "augmix-m5-w4-d2", "augmix-m3-b1-a0.5", "augmix-mstd0.5",
           "original", "originalr", "v0", "v0r", "3a", "v0r-mstd0.5"]


@pytest.fixture(scope="module")
def A():
    refs.timm()
    from timm.data import auto_augment

    return auto_augment


@pytest.fixture(scope="module")
def photos():
    imgs = [v for v in source_photos(gray=False).values() if v.ndim == 3]
    return [cv2.resize(v, (224, 200), interpolation=cv2.INTER_AREA) for v in imgs[:6]]


def _timm_transform(A, s: str):
    hp = dict(translate_const=int(224 * 0.45), img_mean=(124, 116, 104))
    if s.startswith("rand"):
        return A.rand_augment_transform(s, hp)
    if s.startswith("augmix"):
        return A.augment_and_mix_transform(s, {**hp, "translate_pct": 0.3})
    return A.auto_augment_transform(s, hp)


def _op_fields(op) -> tuple:
    if isinstance(op, TimmOp):
        return op.name, op.prob, op.magnitude, op.magnitude_std, op.magnitude_max
    return op.name, op.prob, float(op.magnitude), op.magnitude_std, op.magnitude_max


@pytest.mark.parametrize("s", STRINGS)
def test_strings_build_timms_ops_probabilities_and_magnitudes(A, s):
    ref, ours = _timm_transform(A, s), timm_augment(s)
    if isinstance(ours, TimmRandAugment):
        assert ours.num_layers == ref.num_layers
        assert [_op_fields(o) for o in ours.ops] == [_op_fields(o) for o in ref.ops]
        assert (ours.weights is None) == (ref.choice_weights is None)
        if ours.weights is not None:
            np.testing.assert_allclose(ours.weights, ref.choice_weights)
    elif isinstance(ours, TimmAugMix):
        assert (ours.alpha, ours.width, ours.depth, ours.blended) == (ref.alpha, ref.width, ref.depth, ref.blended)
        assert [_op_fields(o) for o in ours.ops] == [_op_fields(o) for o in ref.ops]
        assert all(o.hparams.translate_pct == 0.3 for o in ours.ops)
    else:
        assert isinstance(ours, TimmAutoAugment)
        assert [[_op_fields(o) for o in sub] for sub in ours.policy] == [[_op_fields(o) for o in sub]
                                                                         for sub in ref.policy]


def test_parser_defaults_and_values():
    assert parse_auto_augment("rand-m9-mstd0.5-inc1") == RandConfig(9, 2, 0.5, 0.5, None, True, None)
    assert parse_auto_augment("rand-m9-n3-mstd0.5-mmax10-p0.7") == RandConfig(9, 3, 0.7, 0.5, 10, False, None)
    assert parse_auto_augment("rand-mstd200").magnitude_std == math.inf  # timm: > 100 means uniform
    assert parse_auto_augment("augmix-m5-w4-d2") == AugMixConfig(5, 4, 2, 1.0, False, math.inf)
    assert parse_auto_augment("original-mstd0.5") == AutoConfig("original", 0.5)
    with pytest.raises(ValueError, match="'foo'"):  # timm ignores a section without a number: a typo here
        parse_auto_augment("rand-foo-m3")


@pytest.mark.parametrize("bad,match", [("rand-x9", "unknown RandAugment section 'x9'"),
                                       ("augmix-n2", "unknown AugMix section 'n2'"),
                                       ("v1", "unknown auto-augment 'v1'"),
                                       ("original-m9", "unknown AutoAugment section 'm9'"),
                                       ("rand-m9.5", "'9.5' is not a valid int"),
                                       ("rand-tnope", "op set must be one of")])
def test_bad_strings_name_the_section(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_auto_augment(bad)


FILL = (124, 116, 104)


def _point_cases(A):
    return [("Brightness 1.63", lambda p: A.brightness(p, 1.63), lambda a: O.brightness(a, 1.63)),
            ("Brightness 0.37", lambda p: A.brightness(p, 0.37), lambda a: O.brightness(a, 0.37)),
            ("Contrast 1.63", lambda p: A.contrast(p, 1.63), lambda a: O.contrast(a, 1.63)),
            ("Contrast 0.3", lambda p: A.contrast(p, 0.3), lambda a: O.contrast(a, 0.3)),
            ("Color 1.63", lambda p: A.color(p, 1.63), lambda a: O.color(a, 1.63)),
            ("Color 0.3", lambda p: A.color(p, 0.3), lambda a: O.color(a, 0.3)),
            ("Sharpness 1.9", lambda p: A.sharpness(p, 1.9), lambda a: O.sharpness(a, 1.9)),
            ("Sharpness 0.1", lambda p: A.sharpness(p, 0.1), lambda a: O.sharpness(a, 0.1)),
            ("AutoContrast", A.auto_contrast, O.autocontrast),
            ("Equalize", A.equalize, O.equalize),
            ("Invert", A.invert, O.invert),
            ("Solarize 100", lambda p: A.solarize(p, 100), lambda a: O.solarize(a, 100)),
            ("SolarizeAdd 80", lambda p: A.solarize_add(p, 80), lambda a: O.solarize_add(a, 80)),
            ("Posterize 3", lambda p: A.posterize(p, 3), lambda a: O.posterize(a, 3)),
            ("Desaturate 0.3", lambda p: A.desaturate(p, 0.3), lambda a: O.color(a, 0.7))]


def test_point_and_enhance_ops_give_pillows_pixels_exactly(A, photos):
    for name, ref, ours in _point_cases(A):
        for img in photos:
            want = np.asarray(ref(Image.fromarray(img)))
            assert np.array_equal(ours(img), want), name


def test_posterize_to_zero_bits_is_black():
    # timm's v0 policy reaches 0 bits ("results in black image"); Pillow >= 10 now refuses it.
    img = np.full((4, 4, 3), 200, np.uint8)
    assert not O.posterize(img, 0).any() and O.posterize(img, 8) is img


@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
def test_geometric_ops_match_pillow_within_interpolation_rounding(A, photos, interp):
    pil = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[interp]
    kw = dict(fillcolor=FILL, resample=pil)
    cases = [("ShearX", lambda p: A.shear_x(p, 0.27, **kw), lambda a: O.shear_x(a, 0.27, interp, FILL)),
             ("ShearY", lambda p: A.shear_y(p, -0.2, **kw), lambda a: O.shear_y(a, -0.2, interp, FILL)),
             ("TranslateX", lambda p: A.translate_x_abs(p, 40.3, **kw), lambda a: O.translate_x(a, 40.3, interp, FILL)),
             ("TranslateY", lambda p: A.translate_y_abs(p, -30.7, **kw),
              lambda a: O.translate_y(a, -30.7, interp, FILL)),
             ("Rotate", lambda p: A.rotate(p, 27.0, **kw), lambda a: O.rotate(a, 27.0, interp, FILL))]
    # Measured on these photos: bilinear 0.35-0.41 (max 1 but for a few pixels on the fill's
    # edge), bicubic 0.61-0.77 (Pillow's cubic kernel is a=-1, OpenCV's a=-0.75).
    limit = 0.6 if interp == "bilinear" else 1.0
    for name, ref, ours in cases:
        diffs = [np.abs(np.asarray(ref(Image.fromarray(a))).astype(int) - ours(a)) for a in photos]
        mad = float(np.mean([d.mean() for d in diffs]))
        assert mad <= limit, (name, mad)
        # The fill covers the same pixels: the far corners of a big shift are the fill.
        assert np.mean([(d > 8).mean() for d in diffs]) < 0.01, name


def test_gaussian_blur_is_close_to_pillows_box_approximation(A, photos):
    d = [np.abs(np.asarray(A.gaussian_blur(Image.fromarray(a), 1.5)).astype(int) - O.gaussian_blur(a, 1.5)).mean()
         for a in photos]
    assert np.mean(d) < 0.6, d  # measured 0.37: Pillow blurs with 3 box passes, this with a true gaussian


def _record_timm(transform, calls: list):
    def spy(name):
        def f(img, *args, **kwargs):
            calls.append((name, args))
            return img
        return f
    for op in getattr(transform, "ops", []):
        op.aug_fn = spy(op.name)
    for sub in getattr(transform, "policy", []):
        for op in sub:
            op.aug_fn = spy(op.name)


def _record_ours(transform, calls: list):
    def spy(name):
        def f(img, *args):
            calls.append((name, args[:-2]))
            return img
        return f
    ops = list(getattr(transform, "ops", [])) + [op for sub in getattr(transform, "policy", []) for op in sub]
    for op in ops:
        op._spec = OpSpec(OPS[op.name].level_to_arg, spy(op.name))


def _draws(A, s: str, n: int) -> tuple[list, list]:
    import random

    random.seed(0)
    np.random.seed(0)
    ref, ours = _timm_transform(A, s), timm_augment(s)
    theirs, mine = [], []
    _record_timm(ref, theirs)
    _record_ours(ours, mine)
    img = Image.new("RGB", (8, 8))
    arr, rng = np.zeros((8, 8, 3), np.uint8), np.random.default_rng(0)
    for _ in range(n):
        ref(img)
        ours(arr, rng)
    return theirs, mine


def _same_distribution(a: Counter, b: Counter, what: str) -> None:
    keys = sorted(set(a) | set(b))
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]])
    p = _stats().chi2_contingency(table)[1] if len(keys) > 1 else 1.0
    assert p > 1e-3, (what, p, dict(a), dict(b))


@pytest.mark.parametrize("s", ["rand-m9-mstd0.5-inc1", "rand-m9-n3-mstd0.5-mmax10-p0.5", "rand-tweights-m5",
                               "rand-m7-mstd101", "original", "v0r-mstd0.5", "augmix-m5-w4-d2", "augmix-m3-mstd0.5"])
def test_op_choice_probability_and_arguments_follow_timms_distributions(A, s):
    theirs, mine = _draws(A, s, 6000)
    _same_distribution(Counter(n for n, _ in theirs), Counter(n for n, _ in mine), f"{s}: ops applied")
    for name in sorted({n for n, _ in theirs}):
        t = [a for n, a in theirs if n == name and a]
        m = [a for n, a in mine if n == name and a]
        if not t:
            assert not m, name
            continue
        tv, mv = np.array([a[0] for a in t], float), np.array([a[0] for a in m], float)
        if len(set(tv)) <= 12:  # discrete arguments (posterize bits, solarize thresholds)
            _same_distribution(Counter(tv.tolist()), Counter(mv.tolist()), f"{s}: {name} arguments")
        else:
            assert _stats().ks_2samp(tv, mv).pvalue > 1e-3, (s, name)


def test_augmix_mix_and_blend_are_timms_for_given_weights(A, photos):
    ref = A.AugMixAugment([A.AugmentOp("Invert", prob=1.0)], width=3, depth=1)
    refb = A.AugMixAugment([A.AugmentOp("Invert", prob=1.0)], width=3, depth=1, blended=True)
    ours = TimmAugMix([TimmOp("Invert", 1.0)], width=3, depth=1)
    oursb = TimmAugMix([TimmOp("Invert", 1.0)], width=3, depth=1, blended=True)
    # Weights summing to 0.97: the mix has fractions, so its truncation is tested too.
    w, m = np.float32([0.2, 0.5, 0.27]), np.float32(0.37)
    rng = np.random.default_rng(0)
    for img in photos[:3]:
        want = np.asarray(ref._apply_basic(Image.fromarray(img), w, m))
        assert np.array_equal(ours.mix(img, w, float(m), rng), want)
        want = np.asarray(refb._apply_blended(Image.fromarray(img), w, m))
        assert np.abs(oursb.mix(img, w, float(m), rng).astype(int) - want).max() <= 1


def test_weighted_choice_is_without_replacement_as_timms():
    weighted, uniform = timm_augment("rand-tweights-n3"), timm_augment("rand-n3")
    rng = np.random.default_rng(0)
    assert all(len(set(weighted.choose(rng))) == 3 for _ in range(500))
    assert any(len(set(uniform.choose(rng))) < 3 for _ in range(500))


def test_augmix_chain_depths_follow_timm():
    calls = []
    op = TimmOp("Invert", 1.0)
    op._spec = OpSpec(OPS["Invert"].level_to_arg, lambda img, *a: calls.append(1) or img)
    aug, rng = TimmAugMix([op], width=4, depth=-1), np.random.default_rng(0)
    counts = []
    for _ in range(3000):
        calls.clear()
        aug(np.zeros((4, 4, 3), np.uint8), rng)
        counts.append(len(calls))
    # 4 chains of 1-3 ops each, uniform: mean 8, variance 4 * 2/3.
    assert abs(np.mean(counts) - 8) < 0.1 and abs(np.var(counts) - 8 / 3) < 0.3


def test_policies_depend_only_on_the_rng(photos):
    for s in ("rand-m9-mstd0.5-inc1", "augmix-m5-w4-d2", "original"):
        t = timm_augment(s)
        a = [t(photos[0], np.random.default_rng(i)) for i in range(8)]
        b = [t(photos[0], np.random.default_rng(i)) for i in range(8)]
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), s
        assert any(not np.array_equal(a[0], x) for x in a[1:]), s


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="unknown timm op 'Spin'"):
        TimmOp("Spin")
    with pytest.raises(ValueError, match="interpolation"):
        Hparams(interpolation="lanczos")
    with pytest.raises(ValueError, match="num_layers"):
        TimmRandAugment([TimmOp("Invert")], num_layers=3, weights=[1.0])
    with pytest.raises(ValueError, match="depth"):
        TimmAugMix([TimmOp("Invert")], depth=0)
