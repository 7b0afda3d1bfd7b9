"""fl.augment.Mixup against timm's Mixup, and torchvision's MixUp/CutMix forms: the same
distributions (λ, switch and mix frequencies, CutMix boxes), the same targets, exact pixels."""

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.augment import sampling

import refs

# scipy comes with the dev extra (albumentations needs it; pinned in constraints.txt).
stats = pytest.importorskip("scipy.stats", reason="the statistical tests need scipy")

N, H, W = 64, 24, 40


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _images(n=N, dtype=torch.float32, seed=0):
    """Distinct values everywhere, so a pasted pixel always differs from the one it replaced."""
    x = torch.randn(n, 3, H, W, generator=_gen(1000 + seed)).to(dtype)
    return x.contiguous(memory_format=torch.channels_last)


@pytest.fixture(params=["host", "device"])
def path(request, monkeypatch):
    """Both ways of painting a batch: box slices (host memory) and whole-batch masks (a
    device's way, forced here on the CPU)."""
    if request.param == "device":
        monkeypatch.setattr(fl.augment.mixing, "on_host", lambda t: False)
    return request.param


def _timm_lams(batches, **kw):
    """timm's per-sample λ, read off its targets (no smoothing; sample i has class i)."""
    timm = refs.timm()
    mix = timm.data.Mixup(label_smoothing=0.0, num_classes=N, **kw)
    np.random.seed(0)
    out = []
    for b in range(batches):
        _, target = mix(_images(seed=b), torch.arange(N))
        out.append(target[torch.arange(N), torch.arange(N)].double())
    return torch.cat(out).numpy()


def _our_lams(batches, **kw):
    mix = fl.augment.Mixup(label_smoothing=0.0, num_classes=N, **kw)
    g = _gen()
    return torch.cat([mix.draw(N, H, W, g).lam for _ in range(batches)]).numpy()


def test_beta_sampler_matches_scipy():
    g = _gen()
    for alpha in (0.2, 0.8, 1.0, 3.0):
        draws = sampling.beta(alpha, (20_000,), g).numpy()
        assert stats.kstest(draws, stats.beta(alpha, alpha).cdf).pvalue > 1e-3, alpha


def test_gamma_sampler_matches_scipy():
    # Large samples: the rejection step of Marsaglia-Tsang changes the law by a few percent.
    g = _gen()
    for shape in (0.2, 1.0):
        draws = np.exp(sampling._log_gamma(shape, (200_000,), g).numpy())
        assert stats.kstest(draws, stats.gamma(shape).cdf).pvalue > 1e-4, shape


def test_mixup_lambda_is_beta_and_matches_timm():
    ours = _our_lams(60, mixup_alpha=0.4, mode="elem")
    assert stats.kstest(ours, stats.beta(0.4, 0.4).cdf).pvalue > 1e-3
    theirs = _timm_lams(40, mixup_alpha=0.4, mode="elem")
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3


@pytest.mark.parametrize("kw", [dict(cutmix_alpha=1.0), dict(cutmix_alpha=0.5, correct_lam=False),
                                dict(cutmix_minmax=(0.2, 0.8))])
def test_cutmix_lambda_matches_timm(kw):
    kw = dict(mixup_alpha=0.0, mode="elem", **kw)
    ours, theirs = _our_lams(40, **kw), _timm_lams(40, **kw)
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3
    assert abs(ours.mean() - theirs.mean()) < 0.03


def test_cutmix_box_geometry_is_timms():
    # Uncorrected λ: each side is int(side · sqrt(1 - λ)), centred on a pixel (cy - h // 2,
    # cy + (h + 1) // 2), clipped; boxes away from the border show the whole side.
    mix = fl.augment.Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem", correct_lam=False)
    params = mix.draw(4000, H, W, _gen())
    y0, y1, x0, x1 = params.box.T
    ratio = torch.sqrt(1 - params.lam)
    for lo, hi, side in ((y0, y1, H), (x0, x1, W)):
        cut = (side * ratio).floor().long()
        inner = (lo > 0) & (hi < side)
        assert inner.sum() > 1000
        assert torch.equal((hi - lo)[inner], cut[inner])
        centre = lo + cut // 2  # the drawn centre, uniform over the side's pixels
        assert torch.equal(hi[inner], (centre + (cut + 1) // 2)[inner])
        whole = (cut < 2)  # boxes of side 0/1 are never clipped: their centres show the law
        assert stats.chisquare(np.bincount(centre[whole].numpy(), minlength=side)).pvalue > 1e-3


def test_prob_and_switch_prob_frequencies():
    mix = fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.6, switch_prob=0.3, mode="elem")
    g = _gen()
    params = [mix.draw(N, H, W, g) for _ in range(100)]
    cut = torch.cat([p.cutmix for p in params]).double()
    unmixed = torch.cat([(p.lam == 1) & ~p.cutmix for p in params]).double()
    n = cut.numel()
    # binomial: 5 standard deviations
    assert abs(unmixed.mean() - 0.4) < 5 * (0.4 * 0.6 / n) ** 0.5
    assert abs(cut.mean() - 0.6 * 0.3) < 5 * (0.18 * 0.82 / n) ** 0.5
    batch = fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.5, switch_prob=0.5)
    drawn = [batch.draw(N, H, W, g) for _ in range(400)]
    assert all(p.lam.shape == (1,) for p in drawn)  # one draw per batch
    mixed = sum(float(p.lam[0] != 1 or p.cutmix[0]) for p in drawn)
    assert abs(mixed / 400 - 0.5) < 5 * (0.25 / 400) ** 0.5


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_pixels_and_targets_follow_the_drawn_params(mode, path):
    mix = fl.augment.Mixup(mixup_alpha=0.5, cutmix_alpha=1.0, mode=mode, label_smoothing=0.1, num_classes=10)
    x, y = _images(), torch.randint(0, 10, (N,), generator=_gen(3))
    for seed in range(6):
        params = mix.draw(N, H, W, _gen(seed))
        given = x.clone()
        out, target = mix(given, y, _gen(seed))
        assert out is given  # mixed in place, as timm's
        lam = params.lam.expand(N) if params.lam.shape[0] == 1 else params.lam
        cut = params.cutmix.expand(N) if params.cutmix.shape[0] == 1 else params.cutmix
        box = params.box.expand(N, 4) if params.box.shape[0] == 1 else params.box
        onehot = torch.full((N, 10), 0.01).scatter_(1, y.view(-1, 1), 0.91)
        for i in range(N):
            j = N - 1 - i
            if cut[i]:
                y0, y1, x0, x1 = box[i].tolist()
                want = x[i].clone()
                want[:, y0:y1, x0:x1] = x[j][:, y0:y1, x0:x1]
                assert torch.equal(out[i], want)
                assert lam[i] == pytest.approx(1 - (y1 - y0) * (x1 - x0) / (H * W))
            else:
                assert torch.allclose(out[i], x[i] * lam[i].float() + x[j] * (1 - lam[i].float()), atol=1e-5)
            assert torch.allclose(target[i], onehot[i] * lam[i].float() + onehot[j] * (1 - lam[i].float()), atol=1e-6)
        assert torch.allclose(target.sum(1), torch.ones(N))


def test_cutmix_box_area_is_the_corrected_lambda(path):
    mix = fl.augment.Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem", label_smoothing=0.0, num_classes=N)
    x = _images()
    for seed in range(5):
        out, target = mix(x.clone(), torch.arange(N), _gen(seed))
        changed = (out != x).any(dim=1).flatten(1).sum(1).double()  # pixels taken from the partner
        lam = target[torch.arange(N), torch.arange(N)].double()
        assert torch.allclose(changed, (1 - lam) * H * W, atol=1e-3)


def test_pair_mode_mirrors_and_odd_batches_keep_the_middle(path):
    mix = fl.augment.Mixup(mixup_alpha=1.0, cutmix_alpha=1.0, mode="pair", prob=1.0, num_classes=N)
    params = mix.draw(N + 1, H, W, _gen())
    assert torch.equal(params.lam, params.lam.flip(0)) and torch.equal(params.box, params.box.flip(0))
    assert params.lam[N // 2] == 1 and not params.cutmix[N // 2]
    for m in ("batch", "elem", "pair"):
        x = _images(N + 1)
        out, target = fl.augment.Mixup(1.0, 1.0, mode=m, num_classes=N + 1)(x.clone(), torch.arange(N + 1), _gen())
        assert torch.equal(out[N // 2], x[N // 2])  # paired with itself
        assert target[N // 2].argmax() == N // 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtype_and_channels_last_are_kept(dtype, path):
    x = _images(dtype=dtype)
    for mix in (fl.augment.Mixup(0.8, 1.0, mode="elem", num_classes=10), fl.augment.MixUp(num_classes=10),
                fl.augment.CutMix(num_classes=10)):
        out, target = mix(x.clone(), torch.arange(N) % 10, _gen())
        assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
        assert target.dtype == torch.float32 and target.shape == (N, 10)
    # A MixUp row's target keeps 1 - the weight its partner's pixels got, rounded as they were.
    mix = fl.augment.Mixup(0.8, 0.0, mode="elem", label_smoothing=0.0, num_classes=N)
    out, target = mix(x.clone(), torch.arange(N), _gen())
    lam = target[torch.arange(N), torch.arange(N)]
    towards = 1 - lam.double()
    assert torch.allclose(towards.to(dtype).double(), towards, rtol=0, atol=1e-7)


def test_disabled_mixup_only_smooths():
    mix = fl.augment.Mixup(1.0, 1.0, label_smoothing=0.2, num_classes=5)
    mix.mixup_enabled = False
    x = _images(8)
    out, target = mix(x.clone(), torch.arange(8) % 5, _gen())
    assert torch.equal(out, x)
    assert torch.allclose(target.max(1).values, torch.full((8,), 0.84))


def test_multi_label_targets_smooth_towards_half():
    mix = fl.augment.Mixup(1.0, multi_label=True, label_smoothing=0.2, num_classes=4, prob=0.0)
    dense = torch.tensor([[1, 0, 1, 0]] * 4, dtype=torch.float32)
    _, target = mix(_images(4), dense, _gen())
    assert torch.allclose(target, torch.tensor([[0.9, 0.1, 0.9, 0.1]] * 4))


def test_torchvision_mixup_and_cutmix_match_torchvision(path):
    refs.torchvision()
    from torchvision.transforms import v2

    torch.manual_seed(0)
    n, classes = 8, 8
    x, rows = _images(n), torch.arange(n)
    for ours, theirs in ((fl.augment.MixUp(alpha=0.5, num_classes=classes), v2.MixUp(alpha=0.5, num_classes=classes)),
                         (fl.augment.CutMix(alpha=1.0, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes))):
        g = _gen()
        for _ in range(10):  # pairs: each sample with the previous one
            out, target = ours(x.clone(), rows, g)
            lam = target[rows, rows]
            assert torch.allclose(target[rows, rows.roll(1)], 1 - lam)
            if isinstance(ours, fl.augment.CutMix):  # the pasted pixels are the previous sample's
                assert torch.equal(out[out != x], x.roll(1, 0)[out != x])
                assert (out != x).any(1).flatten(1).sum(1).eq(round((1 - float(lam[0])) * H * W)).all()
            else:
                assert torch.allclose(out, x * lam[0] + x.roll(1, 0) * (1 - lam[0]), atol=1e-5)
        lam_ours = [float(ours.draw(n, H, W, g).lam[0]) for _ in range(300)]
        lam_theirs = [float(theirs(x, rows)[1][0, 0]) for _ in range(300)]
        assert stats.ks_2samp(lam_ours, lam_theirs).pvalue > 1e-3, type(ours).__name__


def test_random_choice_picks_with_p():
    choice = fl.augment.RandomChoice([fl.augment.MixUp(num_classes=4), fl.augment.CutMix(num_classes=4)], p=[1, 3])
    g = _gen()
    picks = [bool(choice.draw(8, H, W, g).cutmix[0]) for _ in range(1500)]
    assert abs(np.mean(picks) - 0.75) < 5 * (0.75 * 0.25 / 1500) ** 0.5
    out, target = choice(_images(8), torch.arange(8) % 4, g)
    assert target.shape == (8, 4)


def test_both_paths_give_the_same_pixels():
    mix = fl.augment.Mixup(0.8, 1.0, mode="elem", num_classes=10)
    x, y = _images(dtype=torch.bfloat16), torch.arange(N) % 10
    host = mix(x.clone(), y, _gen(7))
    fl.augment.mixing.on_host, real = (lambda t: False), fl.augment.mixing.on_host
    try:
        device = mix(x.clone(), y, _gen(7))
    finally:
        fl.augment.mixing.on_host = real
    assert torch.equal(host[0], device[0]) and torch.equal(host[1], device[1])


def test_torchvision_forms_take_probability_labels():
    probs = torch.softmax(torch.randn(8, 5, generator=_gen()), 1)
    _, target = fl.augment.MixUp()(_images(8), probs, _gen())
    assert torch.allclose(target.sum(1), torch.ones(8))
    with pytest.raises(ValueError, match="num_classes must be passed"):
        fl.augment.CutMix()(_images(8), torch.arange(8), _gen())


@pytest.mark.parametrize("kw,match", [
    (dict(mixup_alpha=-1), "mixup_alpha.*-1"), (dict(mixup_alpha=0, cutmix_alpha=0), "mixup_alpha=0"),
    (dict(prob=1.5), "prob.*1.5"), (dict(switch_prob="x"), "switch_prob.*'x'"), (dict(mode="row"), "mode.*'row'"),
    (dict(label_smoothing=-0.1), "label_smoothing.*-0.1"), (dict(num_classes=0), "num_classes.*0"),
    (dict(cutmix_minmax=(0.8, 0.2)), r"cutmix_minmax.*\(0.8, 0.2\)"), (dict(cutmix_minmax=0.5), "cutmix_minmax.*0.5"),
    (dict(correct_lam=1), "correct_lam.*1"),
])
def test_bad_arguments_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        fl.augment.Mixup(**kw)


def test_bad_inputs_are_clear_errors():
    mix = fl.augment.Mixup(num_classes=10)
    with pytest.raises(TypeError, match="uint8.*normalize=False"):
        mix(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4), _gen())
    with pytest.raises(TypeError, match="multi_label=True"):
        mix(_images(4), torch.rand(4, 10), _gen())
    with pytest.raises(ValueError, match="one row per image"):
        mix(_images(4), torch.arange(3), _gen())
    with pytest.raises(ValueError, match=r"targets must be class indices in \[0, 10\)"):
        mix(_images(4), torch.tensor([0, 1, 2, 10]), _gen())
    with pytest.raises(ValueError, match="cutmix_minmax"):
        fl.augment.Mixup(cutmix_minmax=(0.30, 0.31))(_images(4), torch.arange(4), _gen())
    with pytest.raises(ValueError, match="labels_getter"):
        fl.augment.MixUp(labels_getter=lambda x: x)
    with pytest.raises(TypeError, match="RandomChoice picks among"):
        fl.augment.RandomChoice([fl.augment.Mixup()])


def test_draws_and_mixing_never_read_a_tensor_on_the_host(monkeypatch):
    monkeypatch.setattr(fl.augment.mixing, "on_host", lambda t: False)  # as on a device
    monkeypatch.setattr(fl.augment.erasing, "on_host", lambda t: False)
    # Any .item()/int()/bool() of a tensor would make the host wait for the GPU's queue.
    from fastload.augment.mixing import mix_images, mix_targets

    mix = fl.augment.Mixup(0.8, 1.0, mode="elem", num_classes=10)
    choice = fl.augment.RandomChoice([fl.augment.MixUp(num_classes=10), fl.augment.CutMix(num_classes=10)], p=[1, 2])
    minmax = fl.augment.Mixup(cutmix_minmax=(0.2, 0.8), mode="pair")
    erase = fl.augment.RandomErasing(1.0, mode="rand", min_count=1, max_count=2, num_splits=2)
    x, soft = _images(8), torch.eye(10)[:8]
    calls = []
    for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name: calls.append(_n) or _o(self, *a))
    # Nor build a tensor from host values: on a GPU that copy from pageable memory blocks too.
    for name in ("tensor", "as_tensor", "from_numpy"):
        original = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    for t in (mix, choice, minmax):
        _, lam = mix_images(x.clone(), t.draw(8, H, W, _gen()), t.partner)
        mix_targets(soft, lam, t.partner)
    for mode in ("const", "rand", "pixel"):
        erase.mode = mode
        erase(x.clone(), None, _gen())
    assert calls == []
