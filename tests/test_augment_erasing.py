"""fl.augment.RandomErasing against timm's: the same box counts, areas, aspects and
placements (timm's own draws recorded), fills of each mode, clean splits, dtypes, layout."""

import math

import numpy as np
import pytest
import torch

import fastload as fl

import refs

# scipy comes with the dev extra (albumentations needs it; pinned in constraints.txt).
stats = pytest.importorskip("scipy.stats", reason="the statistical tests need scipy")

H, W = 24, 40


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _batch(n=32, dtype=torch.float32, value=5.0):
    return torch.full((n, 3, H, W), value, dtype=dtype).contiguous(memory_format=torch.channels_last)


@pytest.fixture(params=["host", "device"])
def path(request, monkeypatch):
    """Both ways of painting: box slices (host memory) and whole-batch masks (a device's
    way, forced here on the CPU)."""
    if request.param == "device":
        monkeypatch.setattr(fl.augment.erasing, "on_host", lambda t: False)
    return request.param


def _timm_boxes(batches, n=32, **kw):
    """timm's boxes, recorded where it fills them: per image, a list of (top, left, h, w)."""
    timm = refs.timm()
    module = timm.data.random_erasing
    erasing = module.RandomErasing(device="cpu", **kw)
    per_image = []
    real = module._get_pixels

    def record(per_pixel, rand_color, patch_size, dtype=torch.float32, device="cpu"):
        per_image[-1].append(patch_size[1:])
        return real(per_pixel, rand_color, patch_size, dtype=dtype, device=device)

    erase_one = erasing._erase

    def one(img, *a):
        per_image.append([])
        before = img.clone()
        erase_one(img, *a)
        for k, (h, w) in enumerate(per_image[-1]):
            per_image[-1][k] = (h, w)
        return before

    module._get_pixels, erasing._erase = record, one
    try:
        import random
        random.seed(0)
        for _ in range(batches):
            erasing(_batch(n))
    finally:
        module._get_pixels = real
    return per_image


def _our_boxes(batches, n=32, **kw):
    erasing = fl.augment.RandomErasing(**kw)
    g = _gen()
    per_image = []
    for _ in range(batches):
        drawn = erasing.draw(n, H, W, g)
        for active, box in zip(drawn.active, drawn.box):
            per_image.append([(int(y1 - y0), int(x1 - x0)) for a, (y0, y1, x0, x1) in zip(active, box.tolist()) if a])
    return per_image


@pytest.mark.parametrize("kw", [dict(probability=0.7, max_area=0.4, max_count=3),
                                dict(probability=1.0, min_area=0.1, max_area=0.9, min_aspect=0.1),
                                dict(probability=0.5, min_aspect=0.5, max_aspect=4.0, min_count=2, max_count=2)])
def test_boxes_match_timm(kw):
    ours, theirs = _our_boxes(40, **kw), _timm_boxes(40, **kw)
    counts_ours = np.bincount([len(b) for b in ours], minlength=4)[:4] / len(ours)
    counts_theirs = np.bincount([len(b) for b in theirs], minlength=4)[:4] / len(theirs)
    assert np.abs(counts_ours - counts_theirs).max() < 0.05, (counts_ours, counts_theirs)
    sizes_ours = np.array([s for b in ours for s in b], dtype=float)
    sizes_theirs = np.array([s for b in theirs for s in b], dtype=float)
    assert stats.ks_2samp(sizes_ours.prod(1), sizes_theirs.prod(1)).pvalue > 1e-3  # areas
    assert stats.ks_2samp(np.log(sizes_ours[:, 0] / sizes_ours[:, 1]),
                          np.log(sizes_theirs[:, 0] / sizes_theirs[:, 1])).pvalue > 1e-3  # aspects


def test_area_aspect_and_placement_follow_timms_formulas():
    erasing = fl.augment.RandomErasing(probability=1.0, min_area=0.05, max_area=0.3, min_aspect=0.5)
    drawn = erasing.draw(4000, H, W, _gen())
    assert drawn.active.all()
    y0, y1, x0, x1 = drawn.box[:, 0].T
    h, w = (y1 - y0).double(), (x1 - x0).double()
    assert (y1 <= H).all() and (x1 <= W).all() and (y0 >= 0).all() and (x0 >= 0).all()
    # Each side is round(sqrt(area · aspect)): area/aspect within rounding of U(0.05, 0.3) · H · W.
    area = h * w / (H * W)
    assert area.min() > 0.03 and area.max() < 0.33
    assert stats.kstest(np.log((h / w).numpy()), stats.uniform(math.log(0.5) - 0.15, 2 * math.log(2) + 0.3).cdf
                        ).statistic < 0.1
    # The top-left corner is uniform over the places the box fits: jittered by U(0, 1)
    # within its pixel, its share of those places is then U(0, 1).
    jitter = np.random.default_rng(0).random((2, len(h)))
    for start, size, side, u in ((y0, h, H, jitter[0]), (x0, w, W, jitter[1])):
        rel = (start.double().numpy() + u) / (side - size.numpy() + 1)
        assert stats.kstest(rel, "uniform").pvalue > 1e-3


def test_a_box_must_be_smaller_than_the_image(path):
    # timm places a box only if h < H and w < W: one of the image's whole size never fits.
    whole = fl.augment.RandomErasing(1.0, min_area=1.0, max_area=1.0, min_aspect=1.0, max_aspect=1.0)
    x = torch.full((8, 3, 6, 6), 5.0)
    assert torch.equal(whole(x.clone(), generator=_gen()), x)
    almost = fl.augment.RandomErasing(1.0, min_area=25 / 36, max_area=25 / 36, min_aspect=1.0, max_aspect=1.0)
    assert ((almost(x.clone(), generator=_gen()) == 0).flatten(1).sum(1) == 25 * 3).all()


def test_counts_are_uniform_between_min_and_max():
    drawn = fl.augment.RandomErasing(probability=1.0, max_area=0.1, min_count=2, max_count=5).draw(4000, H, W, _gen())
    counts = np.bincount(drawn.active.sum(1).numpy(), minlength=6)
    assert counts[0] == counts[1] == 0
    assert stats.chisquare(counts[2:]).pvalue > 1e-3


def test_probability_and_clean_split(path):
    erasing = fl.augment.RandomErasing(probability=0.3, num_splits=4)
    images = _batch(400)
    out, targets = erasing(images.clone(), torch.arange(400), _gen())
    assert torch.equal(targets, torch.arange(400))
    touched = (out != 5.0).flatten(1).any(1)
    assert not touched[:100].any()  # the clean split: 400 // 4
    assert abs(touched[100:].double().mean() - 0.3) < 5 * (0.21 / 300) ** 0.5


def test_const_fills_zero_rand_one_color_per_box_pixel_noise(path):
    x = _batch(200)
    const = fl.augment.RandomErasing(1.0, mode="const")(x.clone(), generator=_gen())
    assert set((const[const != 5.0]).unique().tolist()) == {0.0}

    rand = fl.augment.RandomErasing(1.0, mode="rand")(x.clone(), generator=_gen())
    colors = []
    for img in rand:
        erased = img[0] != 5.0
        assert erased.any()
        per_channel = img[:, erased]
        assert torch.equal(per_channel, per_channel[:, :1].expand_as(per_channel))  # one color per box
        colors.append(per_channel[:, 0])
    colors = torch.stack(colors)
    assert stats.kstest(colors.flatten().numpy(), "norm").pvalue > 1e-3
    assert abs(np.corrcoef(colors.T.numpy())[0, 1]) < 0.3  # each channel its own value

    pixel = fl.augment.RandomErasing(1.0, mode="pixel")(x.clone(), generator=_gen())
    values = pixel[pixel != 5.0]
    assert values.numel() > 10_000
    assert stats.kstest(values[:20_000].numpy(), "norm").pvalue > 1e-3
    assert abs(float(values.mean())) < 0.02 and abs(float(values.std()) - 1) < 0.02


def test_overlapping_boxes_paint_in_order(path):
    erasing = fl.augment.RandomErasing(1.0, mode="rand", min_area=0.3, max_area=0.6, min_count=3, max_count=3)
    x = _batch(16)
    drawn = erasing.draw(16, H, W, _gen(4))
    out = erasing(x.clone(), generator=_gen(4))
    for i in range(16):
        last = [k for k in range(3) if drawn.active[i, k]][-1]
        y0, y1, x0, x1 = drawn.box[i, last].tolist()
        region = out[i, :, y0:y1, x0:x1].flatten(1)
        assert torch.equal(region, region[:, :1].expand_as(region))  # the last box is whole


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["const", "rand", "pixel"])
def test_dtype_layout_and_in_place(dtype, mode, path):
    x = _batch(8, dtype)
    out, y = fl.augment.RandomErasing(1.0, mode=mode)(x, "targets", _gen())
    assert out is x and y == "targets"
    assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
    assert (out != 5.0).any()
    assert fl.augment.RandomErasing(1.0)(_batch(2)).shape == (2, 3, H, W)  # timm's images-only call
    one = _batch(1, dtype)[0]
    assert fl.augment.RandomErasing(1.0, mode=mode)(one, generator=_gen()) is one and (one != 5.0).any()


def test_both_paths_erase_the_same_boxes():
    x = torch.randn(32, 3, H, W)
    for mode in ("const", "rand", "pixel"):
        erasing = fl.augment.RandomErasing(0.8, mode=mode, max_count=3)
        host = erasing(x.clone(), generator=_gen(5))
        fl.augment.erasing.on_host, real = (lambda t: False), fl.augment.erasing.on_host
        try:
            device = erasing(x.clone(), generator=_gen(5))
        finally:
            fl.augment.erasing.on_host = real
        assert torch.equal(host != x, device != x), mode
        if mode != "pixel":  # pixel noise is drawn per box on the host, per batch on a device
            assert torch.equal(host, device), mode


def test_same_generator_same_boxes(path):
    erasing = fl.augment.RandomErasing(0.5, mode="pixel", max_count=2)
    a = erasing(_batch(), generator=_gen(3))
    b = erasing(_batch(), generator=_gen(3))
    c = erasing(_batch(), generator=_gen(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("kw,match", [
    (dict(probability=2), "probability.*2"), (dict(min_area=0.5, max_area=0.2), "min_area=0.5"),
    (dict(min_aspect=0), "min_aspect.*0"), (dict(min_aspect=2.0, max_aspect=1.0), "min_aspect.*2.0"),
    (dict(mode="noise"), "mode.*'noise'"), (dict(min_count=0), "min_count.*0"),
    (dict(min_count=3, max_count=2), "max_count.*2"), (dict(num_splits=-1), "num_splits.*-1"),
    (dict(device="gpu7"), "device.*'gpu7'"),
])
def test_bad_arguments_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        fl.augment.RandomErasing(**kw)


def test_bad_inputs():
    with pytest.raises(TypeError, match="uint8"):
        fl.augment.RandomErasing()(torch.zeros(2, 3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="N×C×H×W"):
        fl.augment.RandomErasing()(torch.zeros(4, 4))
