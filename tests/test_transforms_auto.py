"""The random transforms against torchvision v2: pixels where the parameters are fixed,
operation tables and magnitudes exactly, draws statistically, and reproducibility: the
output depends on (seed, epoch, index) only, through a real Loader."""

import collections
import os

import numpy as np
import pytest
import refs
import torch
from conftest import photo_jpegs

import fastload as fl
import fastload.transforms as T
import fastload.transforms.auto_augment as auto
from fastload.transforms import _augment_ops as ops
from fastload.transforms import _policies

tv = refs.torchvision()
stats = pytest.importorskip("scipy.stats", reason="the statistical tests need scipy (the dev extra)")
import torchvision.transforms.v2 as V2


@pytest.fixture(scope="module")
def photo():
    from fastload.photos.bundled import source_photos

    return np.ascontiguousarray(source_photos()["coffee.png"][80:304, 150:374])  # 224×224 real photo


def chw(img):
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)


def hwc(t):
    return t.permute(1, 2, 0).numpy()


def assert_close(ours, theirs, what):
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    assert diff.mean() <= 0.05 and (diff > 1).mean() <= 0.005, (what, diff.mean(), (diff > 1).mean())


# -- fixed parameters: the same pixels as torchvision's transform ------------------------

FIXED = [
    (lambda m: m.ColorJitter(brightness=(1.3, 1.3)), "brightness"),
    (lambda m: m.ColorJitter(contrast=(0.55, 0.55)), "contrast"),
    (lambda m: m.ColorJitter(saturation=(1.7, 1.7)), "saturation"),
    (lambda m: m.ColorJitter(hue=(0.2, 0.2)), "hue"),
    (lambda m: m.RandomGrayscale(p=1.0), "grayscale"),
    (lambda m: m.RandomSolarize(100.0, p=1.0), "solarize"),
    (lambda m: m.GaussianBlur(7, sigma=1.3), "blur"),
    (lambda m: m.RandomVerticalFlip(p=1.0), "vflip"),
    (lambda m: m.RandomCrop(232, padding=4, padding_mode="reflect"), "crop reflect"),
    (lambda m: m.RandomCrop(230, padding=[3, 3], fill=[9, 200, 30]), "crop fill"),
    (lambda m: m.RandomCrop(226, padding=1, padding_mode="symmetric"), "crop symmetric"),
]


@pytest.mark.parametrize("make,what", FIXED, ids=[w for _, w in FIXED])
def test_fixed_parameter_transforms_match_torchvision(photo, make, what):
    ours = make(T)(photo, np.random.default_rng(0))
    theirs = hwc(make(V2)(chw(photo)))
    assert_close(np.asarray(ours), theirs, what)


# -- the policies' tables: operations, magnitudes, probabilities -----------------------

SPACES = [(ops.RAND_AUGMENT, V2.RandAugment._AUGMENTATION_SPACE, 31),
          (ops.TRIVIAL_AUGMENT_WIDE, V2.TrivialAugmentWide._AUGMENTATION_SPACE, 31),
          (ops.AUTO_AUGMENT, V2.AutoAugment._AUGMENTATION_SPACE, 10),
          (ops.AUGMIX_ALL, V2.AugMix._AUGMENTATION_SPACE, 10),
          (ops.AUGMIX_PARTIAL, V2.AugMix._PARTIAL_AUGMENTATION_SPACE, 10)]


@pytest.mark.parametrize("ours,theirs,bins", SPACES)
def test_operation_spaces_and_magnitudes_are_torchvisions(ours, theirs, bins):
    assert list(ours) == list(theirs), "same operations, in the same order"
    for op, (fn, signed) in theirs.items():
        assert ours[op][1] == signed, op
        for n, h, w in ((bins, 224, 224), (bins, 181, 240), (7, 32, 32)):
            want, got = fn(n, h, w), ours[op][0](n, h, w)
            if want is None:
                assert got is None, op
            else:  # bit for bit: a solarize threshold of exactly 170 must not become 169.99998
                np.testing.assert_array_equal(got, want.numpy(), err_msg=f"{op} {n} {h}x{w}")


def test_auto_augment_policies_are_torchvisions():
    for policy in tv.transforms.AutoAugmentPolicy:
        theirs = V2.AutoAugment(policy)._policies
        assert [tuple(tuple(s) for s in sub) for sub in _policies.POLICIES[policy.value]] == theirs
        assert T.AutoAugment(policy).policies == T.AutoAugment(policy.value).policies


@pytest.mark.parametrize("space,theirs_cls,bins", [(ops.RAND_AUGMENT, V2.RandAugment, 31),
                                                   (ops.TRIVIAL_AUGMENT_WIDE, V2.TrivialAugmentWide, 31),
                                                   (ops.AUTO_AUGMENT, V2.AutoAugment, 10),
                                                   (ops.AUGMIX_ALL, V2.AugMix, 10)])
def test_each_operation_at_each_magnitude_gives_torchvisions_pixels(photo, space, theirs_cls, bins):
    theirs = theirs_cls()
    interpolation = "bilinear" if theirs_cls is V2.AugMix else "nearest"
    for op in space:
        for index in (0, 1, bins // 3, bins - 1):
            table = space[op][0](bins, 224, 224)
            for sign in ((1, -1) if space[op][1] else (1,)):
                magnitude = 0.0 if table is None else sign * float(table[index])
                ours = ops.apply_op(photo, op, magnitude, interpolation, None)
                want = theirs._apply_image_or_video_transform(chw(photo), op, magnitude,
                                                              interpolation=theirs.interpolation, fill=theirs._fill)
                assert_close(ours, hwc(want), (op, index, sign))


# -- draws, checked statistically ------------------------------------------------------

@pytest.fixture
def recorded(monkeypatch):
    """(op, magnitude) of every operation applied, the image passed through unchanged."""
    calls = []

    def record(img, op, magnitude, interpolation, fill):
        calls.append((op, magnitude))
        return img

    monkeypatch.setattr(auto, "apply_op", record)
    return calls


def uniform_ok(counts, k):
    """Chi-square goodness of fit to uniform over k categories, at the 0.1% level."""
    observed = np.array([counts.get(i, 0) for i in range(k)]) if isinstance(counts, dict) else counts
    return stats.chisquare(observed).pvalue > 1e-3


def sign_ok(values):
    positive = sum(v > 0 for v in values)
    return stats.binomtest(positive, len(values), 0.5).pvalue > 1e-3


def test_rand_augment_draws(recorded):
    img, rng, t = np.zeros((32, 32, 3), np.uint8), np.random.default_rng(1), T.RandAugment(num_ops=2, magnitude=9)
    for _ in range(3000):
        t(img, rng)
    assert len(recorded) == 6000
    names = list(ops.RAND_AUGMENT)
    assert uniform_ok(collections.Counter(names.index(op) for op, _ in recorded), len(names))
    for op in names:
        table = ops.RAND_AUGMENT[op][0](31, 32, 32)
        got = [m for o, m in recorded if o == op]
        if table is None:
            assert set(got) == {0.0}, op
        else:
            assert {abs(m) for m in got} == {float(table[9])}, op
            assert sign_ok(got) if ops.RAND_AUGMENT[op][1] else min(got) >= 0, op


def test_trivial_augment_draws(recorded):
    img, rng, t = np.zeros((32, 32, 3), np.uint8), np.random.default_rng(2), T.TrivialAugmentWide()
    for _ in range(8000):
        t(img, rng)
    names = list(ops.TRIVIAL_AUGMENT_WIDE)
    assert uniform_ok(collections.Counter(names.index(op) for op, _ in recorded), len(names))
    # The bin of every draw of the operations whose 31 magnitudes are distinct, pooled.
    bins = collections.Counter()
    for op, m in recorded:
        if op in ("Identity", "Posterize", "AutoContrast", "Equalize"):
            continue
        table = ops.TRIVIAL_AUGMENT_WIDE[op][0](31, 32, 32)
        bins[int(np.flatnonzero(np.isclose(table, abs(m)))[0])] += 1
    assert uniform_ok(bins, 31), bins
    assert sign_ok([m for op, m in recorded if op == "Rotate" and m != 0])


def test_auto_augment_magnitudes_come_from_the_10_bins(recorded):
    t, rng, img = T.AutoAugment("imagenet"), np.random.default_rng(3), np.zeros((32, 32, 3), np.uint8)
    for _ in range(5000):
        t(img, rng)
    expected = 5000 * 2 * np.mean([p for sub in t.policies for _, p, _ in sub])
    assert abs(len(recorded) - expected) < 4 * np.sqrt(expected), (len(recorded), expected)
    for op, m in recorded:
        table = ops.AUTO_AUGMENT[op][0](10, 32, 32)
        allowed = {0.0} if table is None else {float(table[i]) for _, _, i in
                                              (s for sub in t.policies for s in sub if s[0] == op)}
        assert abs(m) in allowed, (op, m)
    assert sign_ok([m for op, m in recorded if op == "Rotate"])


def test_auto_augment_sub_policy_choice_and_probabilities(monkeypatch):
    """Sub-policies drawn uniformly; within one, each step applied with its probability."""
    t = T.AutoAugment("svhn")
    steps = np.zeros((len(t.policies), 2), int)
    calls = []
    monkeypatch.setattr(auto, "apply_op", lambda img, op, m, i, f: calls.append(op) or img)
    # Tag each step with a unique name so a call tells which step of which sub-policy ran.
    names = [[f"{k}:{j}" for j in range(2)] for k in range(len(t.policies))]
    tagged = [tuple((names[k][j], p, i) for j, (op, p, i) in enumerate(sub)) for k, sub in enumerate(t.policies)]
    space = {n: ops.AUTO_AUGMENT[op] for k, sub in enumerate(t.policies) for n, (op, _, _) in zip(names[k], sub)}
    monkeypatch.setattr(t, "policies", tagged)
    monkeypatch.setattr(t, "space", space)
    rng, img = np.random.default_rng(4), np.zeros((8, 8, 3), np.uint8)
    n = 12500
    for _ in range(n):
        calls.clear()
        t(img, rng)
        for c in calls:
            k, j = map(int, c.split(":"))
            steps[k, j] += 1
    # Sub-policy k runs step j with probability p_kj; P(step j ran) = p_kj / 25.
    probs = np.array([[p for _, p, _ in sub] for sub in _policies.SVHN])
    expected = n * probs / len(probs)
    z = (steps - expected) / np.sqrt(np.maximum(expected * (1 - probs / len(probs)), 1e-9))
    assert np.all(np.abs(z[probs > 0]) < 4.5), z
    assert np.all(steps[probs == 0] == 0)


def test_augmix_draws(recorded):
    img, rng, t = np.zeros((16, 16, 3), np.uint8), np.random.default_rng(5), T.AugMix(severity=3)
    depths = []
    for _ in range(3000):
        before = len(recorded)
        t(img, rng)
        depths.append(len(recorded) - before)
    # 3 chains of depth 1-3 each: total depth per image is a sum of 3 uniform {1, 2, 3}.
    assert 3 <= min(depths) and max(depths) <= 9 and abs(np.mean(depths) - 6) < 0.1
    names = list(ops.AUGMIX_ALL)
    assert uniform_ok(collections.Counter(names.index(op) for op, _ in recorded), len(names))
    shears = [abs(m) for op, m in recorded if op == "ShearX"]
    table = ops.AUGMIX_ALL["ShearX"][0](10, 16, 16)
    bins = collections.Counter(int(np.flatnonzero(np.isclose(table, m))[0]) for m in shears)
    assert set(bins) == {0, 1, 2} and uniform_ok(bins, 3), "bins below severity only, uniformly"


def test_augmix_mixes_convexly(photo):
    out = T.AugMix()(photo, np.random.default_rng(6))
    assert out.shape == photo.shape and out.dtype == np.uint8
    # Keep-weight ~ Beta(1, 1): across images the output sits between the original and
    # the chains; with all weight on the original (alpha tiny, p≈1/2) it is the original.
    same = sum(np.array_equal(T.AugMix(alpha=1e-3)(photo, np.random.default_rng(s)), photo) for s in range(40))
    assert 5 < same < 35, same


@pytest.mark.parametrize("args", [(0.4, 0.4, 0.4, 0.1), (1.5, 0.0, (0.2, 3.0), (-0.5, 0.25)), (None, 1.0, 0.999, 0.5),
                                  ((1.0, 1.0), (0.5, 0.5), None, (0.0, 0.0))])
def test_color_jitter_ranges_are_torchvisions(args):
    ours, theirs = T.ColorJitter(*args), V2.ColorJitter(*args)
    for name in ("brightness", "contrast", "saturation", "hue"):
        assert getattr(ours, name) == getattr(theirs, name), (name, args)


def test_color_jitter_draws(monkeypatch):
    seen = collections.defaultdict(list)
    order = []
    for name in ("adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue"):
        def fake(img, f, name=name):
            seen[name].append(f)
            order.append(name)
            return img
        monkeypatch.setattr(T.color.F, name, fake)
    t = T.ColorJitter(0.4, (0.2, 0.9), 0.4, 0.1)  # made after the patch: it holds the fakes
    rng, img = np.random.default_rng(7), np.zeros((4, 4, 3), np.uint8)
    firsts = collections.Counter()
    for _ in range(4000):
        order.clear()
        t(img, rng)
        firsts[order[0]] += 1
    assert uniform_ok(np.array(list(firsts.values())), 4), firsts
    for name, (lo, hi) in (("adjust_brightness", (0.6, 1.4)), ("adjust_contrast", (0.2, 0.9)),
                           ("adjust_hue", (-0.1, 0.1))):
        assert stats.kstest(seen[name], stats.uniform(lo, hi - lo).cdf).pvalue > 1e-3, name


def test_probabilities_of_the_random_apply_transforms(photo):
    rng = np.random.default_rng(8)
    small = photo[:8, :8]
    for t, p in ((T.RandomGrayscale(0.3), 0.3), (T.RandomSolarize(0, 0.7), 0.7), (T.RandomVerticalFlip(0.2), 0.2)):
        hits = sum(not np.array_equal(t(small, rng), small) for _ in range(4000))
        assert stats.binomtest(hits, 4000, p).pvalue > 1e-3, (t, hits)


def test_random_crop_pad_if_needed_pads_by_the_shortfall_on_each_side(photo):
    t = T.RandomCrop((240, 200), pad_if_needed=True, padding_mode="edge")
    padding, top, left = t.params(224, 224, np.random.default_rng(0))
    assert padding == [0, 16, 0, 16], "torchvision pads both sides by the whole shortfall"
    out = t(photo, np.random.default_rng(0))
    padded = hwc(V2.functional.pad(chw(photo), [0, 16, 0, 16], padding_mode="edge"))
    np.testing.assert_array_equal(out, padded[top:top + 240, left:left + 200])


def test_random_crop_positions_are_uniform():
    t, rng = T.RandomCrop(30, padding=4), np.random.default_rng(9)
    tops, lefts = collections.Counter(), collections.Counter()
    for _ in range(5000):
        padding, top, left = t.params(32, 32, rng)
        assert padding == [4, 4, 4, 4]
        tops[top] += 1
        lefts[left] += 1
    assert set(tops) == set(lefts) == set(range(11)) and uniform_ok(tops, 11) and uniform_ok(lefts, 11)


# -- reproducibility -----------------------------------------------------------------------

PIPELINE = [T.RandAugment(), T.TrivialAugmentWide(), T.AutoAugment(), T.AugMix(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
            T.RandomGrayscale(0.2), T.GaussianBlur(5), T.RandomSolarize(128, 0.2), T.RandomVerticalFlip(),
            T.RandomCrop(56, padding=4, padding_mode="reflect")]


def test_same_rng_same_output(photo):
    for t in PIPELINE:
        a = t(photo, np.random.default_rng(11))
        b = t(photo, np.random.default_rng(11))
        np.testing.assert_array_equal(a, b, err_msg=repr(t))
    outs = {T.RandAugment()(photo, np.random.default_rng(s)).tobytes() for s in range(8)}
    assert len(outs) > 4, "different generators, different augmentations"


def test_transforms_pickle_for_spawned_workers(photo):
    import pickle

    for t in PIPELINE + [T.AugMix(all_ops=False), T.AutoAugment("svhn", fill=[1, 2, 3])]:
        copy = pickle.loads(pickle.dumps(t))
        np.testing.assert_array_equal(copy(photo, np.random.default_rng(3)), t(photo, np.random.default_rng(3)))


def test_grayscale_images_go_through_every_transform(photo):
    gray = np.ascontiguousarray(photo[:, :, :1])
    for t in PIPELINE:
        for img in (gray, gray[:, :, 0]):
            out = t(img, np.random.default_rng(12))
            assert out.dtype == np.uint8 and out.ndim == img.ndim and (out.ndim == 2 or out.shape[2] == 1), repr(t)


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    for i, data in enumerate(photo_jpegs((80, 140), 2, seed=1)[:16]):
        os.makedirs(root / f"c{i % 2}", exist_ok=True)
        (root / f"c{i % 2}" / f"{i:02d}.jpg").write_bytes(data)
    return str(root)


def _epochs(folder, **options):
    ds = fl.ImageFolder(folder, transform=[T.RandomResizedCrop(64)] + PIPELINE)
    with fl.Loader(ds, batch_size=4, shuffle=False, seed=5, device="cpu", normalize=False, **options) as loader:
        return [torch.cat([x for x, _ in loader]) for _ in range(2)]


def test_output_depends_on_seed_epoch_and_index_only(photo_folder):
    serial = _epochs(photo_folder, num_workers=0)
    assert serial[0].shape[1:] == (3, 56, 56), "RandomCrop(56, padding=4) after the planned 64×64 crop"
    assert not torch.equal(serial[0], serial[1]), "each epoch draws anew"
    for options in ({"num_workers": 2, "backend": "process"}, {"num_workers": 2, "backend": "thread"}):
        other = _epochs(photo_folder, **options)
        for epoch in (0, 1):
            assert torch.equal(serial[epoch], other[epoch]), (options, epoch)
    ds = fl.ImageFolder(photo_folder, transform=[T.RandomResizedCrop(64)] + PIPELINE)
    img, _ = ds.load(5, epoch=1, seed=5)
    assert torch.equal(torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1), serial[1][5])


def test_random_crop_first_decodes_whole_images(photo_folder):
    ds = fl.ImageFolder(photo_folder, transform=[T.RandomCrop(72, padding=4), T.RandAugment()])
    assert ds.transform.plan(100, 100, np.random.default_rng(0)) is None, "not a crop planner"
    img, _ = ds.load(0, epoch=0, seed=1)
    assert img.shape == (72, 72, 3)


@pytest.mark.parametrize("make,error,words", [
    (lambda: T.RandAugment(num_ops=-1), ValueError, "-1"),
    (lambda: T.RandAugment(magnitude=31), ValueError, "31"),
    (lambda: T.RandAugment(num_ops=2.0), TypeError, "2.0"),
    (lambda: T.RandAugment(interpolation="bicubic"), ValueError, "bicubic"),
    (lambda: T.TrivialAugmentWide(num_magnitude_bins=1), ValueError, "1"),
    (lambda: T.TrivialAugmentWide(fill="white"), TypeError, "white"),
    (lambda: T.AutoAugment("imagenet21k"), ValueError, "imagenet21k"),
    (lambda: T.AugMix(severity=11), ValueError, "11"),
    (lambda: T.AugMix(alpha=0), ValueError, "0"),
    (lambda: T.AugMix(mixture_width=0), ValueError, "0"),
    (lambda: T.ColorJitter(brightness=-0.1), ValueError, "-0.1"),
    (lambda: T.ColorJitter(hue=0.6), ValueError, "0.6"),
    (lambda: T.ColorJitter(contrast=(0.9, 0.5)), ValueError, "(0.9, 0.5)"),
    (lambda: T.ColorJitter(saturation="lots"), TypeError, "lots"),
    (lambda: T.RandomGrayscale(1.5), ValueError, "1.5"),
    (lambda: T.RandomSolarize(300), ValueError, "300"),
    (lambda: T.GaussianBlur(4), ValueError, "4"),
    (lambda: T.GaussianBlur(3, sigma=(2.0, 1.0)), ValueError, "(2.0, 1.0)"),
    (lambda: T.RandomCrop(0), ValueError, "0"),
    (lambda: T.RandomCrop(32, padding=[1, 2, 3]), ValueError, "[1, 2, 3]"),
    (lambda: T.RandomCrop(32, padding_mode="wrap"), ValueError, "wrap"),
    (lambda: T.RandomVerticalFlip(2), ValueError, "2"),
])
def test_bad_arguments_name_the_value(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


def test_random_crop_too_small_image_says_so():
    with pytest.raises(ValueError, match="pad_if_needed"):
        T.RandomCrop(64)(np.zeros((32, 32, 3), np.uint8), np.random.default_rng(0))
