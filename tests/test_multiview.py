"""Multi-view (SSL) transforms: several views per image out of one planned decode, batched per view."""

import os

import numpy as np
import pytest
import torch

import fastload as fl
from fastload import transforms as T
from fastload.batch import HostBatch
from fastload.collate import fast_collate
from fastload.datasets.base import sample_rng
from fastload.decode import costs, get_decoder, plan, read_header, roi
from fastload.decode.resize import PHASE_TOL, Crop, phase_error
from fastload.sources import ring
from fastload.sources.handoff import BufferTable

import refs
from conftest import jpeg_bytes, make_image, photo_jpegs, write_folder

ROI = pytest.mark.skipif(not roi.available(), reason="region decode needs: pip install 'fastload[roi]'")
GLOBAL, LOCAL = (0.4, 1.0), (0.05, 0.4)


def multicrop(n_global=2, n_local=6, global_size=64, local_size=32, reduced_decode=True):
    """DINO's geometry (crops and flips) at small sizes: fast on 2 busy cores."""
    return T.MultiView([T.train(global_size, scale=GLOBAL), T.train(local_size, scale=LOCAL)],
                       counts=[n_global, n_local], reduced_decode=reduced_decode)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("mv"), num_classes=2, per_class=10, size=(150, 200))


@pytest.fixture
def planner_reset():
    yield
    plan.set_planner(None)


# ---- the transform -------------------------------------------------------------------------


def test_views_have_the_sizes_and_counts_asked():
    data = jpeg_bytes(make_image(0, 300, 400))
    mv = T.MultiView([T.train(64), T.train((40, 48)), [T.RandomResizedCrop(16)]], counts=[2, 3, 1])
    views = mv.decode(data, get_decoder(), sample_rng(0, 0, 0))
    assert mv.num_views == 6 and isinstance(views, tuple)
    assert [v.shape for v in views] == [(64, 64, 3)] * 2 + [(40, 48, 3)] * 3 + [(16, 16, 3)]
    assert all(v.dtype == np.uint8 for v in views)


@pytest.mark.parametrize("backend", ["opencv", "pillow"])
def test_decoders_the_planner_does_not_cost_serve_every_view(backend):
    """OpenCV and Pillow decode at a power-of-2 scale: the one that serves the largest
    view's crop serves them all (the same pixels as cropping a full decode, to the
    reduced decode's tolerance)."""
    dec = get_decoder(backend)
    mv = T.MultiView([T.train(192, scale=(0.4, 1)), T.train(24, scale=(0.05, 0.4))], counts=[1, 3])
    diffs = []
    for i, data in enumerate(photo_jpegs((600, 900), 1, seed=12)[:6]):
        views = mv.decode(data, dec, sample_rng(0, 0, i))
        assert [v.shape for v in views] == [(192, 192, 3)] + [(24, 24, 3)] * 3
        want = mv(dec.decode(data), sample_rng(0, 0, i))
        diffs += [np.abs(x.astype(np.int16) - y).mean() for x, y in zip(views, want)]
    assert np.mean(diffs) <= 1.5 and np.max(diffs) <= 5, (np.mean(diffs), np.max(diffs))


def test_a_view_without_a_crop_planner_gets_the_whole_image():
    img = make_image(6, 480, 640)
    data = jpeg_bytes(img)
    mv = T.MultiView([T.train(32), [T.RandomHorizontalFlip(1.0)]])
    dec = get_decoder()
    views = mv.decode(data, dec, sample_rng(0, 0, 1))
    assert [v.shape for v in views] == [(32, 32, 3), (480, 640, 3)]
    assert np.array_equal(views[1], dec.decode(data)[:, ::-1])  # a full-size decode, flipped


def test_crops_lie_within_the_image_at_the_scales_asked():
    """Every crop inside the image; each kind of view's areas distributed as torchvision's
    RandomResizedCrop draws them for its scale range (quantiles within 0.03 of the image)."""
    tv = refs.torchvision()
    mv = multicrop(n_global=2, n_local=8)
    h, w = 375, 500
    areas = {GLOBAL: [], LOCAL: []}
    for i in range(400):
        crops = mv.plan(h, w, sample_rng(1, 0, i))
        assert len(crops) == 10
        for k, c in enumerate(crops):
            assert 0 <= c.top and 0 <= c.left and c.top + c.height <= h and c.left + c.width <= w, c
            areas[GLOBAL if k < 2 else LOCAL].append(c.height * c.width / (h * w))
    torch.manual_seed(0)
    img = torch.zeros(3, h, w)
    q = [0.05, 0.25, 0.5, 0.75, 0.95]
    for scale, got in areas.items():
        ref = [hh * ww / (h * w) for _, _, hh, ww in
               (tv.transforms.RandomResizedCrop.get_params(img, list(scale), [3 / 4, 4 / 3]) for _ in range(4000))]
        got = np.array(got)
        assert ((got >= scale[0] * 0.97) & (got <= scale[1] * 1.03)).mean() >= 0.99, (scale, got.min(), got.max())
        assert np.abs(np.quantile(got, q) - np.quantile(ref, q)).max() < 0.03 * (1 + 3 * (scale == GLOBAL)), scale


def test_views_differ():
    data = jpeg_bytes(make_image(3, 240, 320))
    views = multicrop(n_global=2, n_local=4).decode(data, get_decoder(), sample_rng(0, 0, 7))
    for group in (views[:2], views[2:]):
        for a in range(len(group)):
            for b in range(a + 1, len(group)):
                assert np.abs(group[a].astype(np.int16) - group[b]).mean() > 1, (a, b)


def test_a_decoded_image_gets_the_draws_of_a_planned_decode():
    """``mv(img, rng)`` draws every crop first, then each view's later transforms: what
    ``mv.decode`` draws, so both paths make the same views of the same sample."""
    mv = multicrop(reduced_decode=False)
    data = jpeg_bytes(make_image(4, 200, 260))
    dec = get_decoder()
    a = mv.decode(data, dec, sample_rng(0, 1, 2))
    b = mv(dec.decode(data), sample_rng(0, 1, 2))
    for x, y in zip(a, b):
        assert np.abs(x.astype(np.int16) - y).max() <= 1


@ROI
def test_the_planned_region_serves_every_view(planner_reset):
    """Region decode of the crops' union box: every view's pixels are the full decode's."""
    plan.set_planner(plan.Planner(costs.DEFAULT_COSTS, region=True))
    # Local crops only, small against the image: their union is a region worth decoding.
    mv = T.MultiView([T.train(32, scale=(0.01, 0.03))], counts=[2], reduced_decode=False)
    dec, kinds = get_decoder(), []
    for i, data in enumerate(photo_jpegs((600, 900), 1, seed=8)[:6]):
        rng = sample_rng(0, 0, i)
        steps = mv.plan_decode(data, dec, rng)
        kinds.append(steps.plan.kind)
        if steps.region is not None:
            y0, x0, y1, x1 = steps.region
            for c in steps.crops:  # the union box holds every crop
                assert y0 <= c.top and x0 <= c.left and c.top + c.height <= y1 and c.left + c.width <= x1
        got = mv.finish_decode(data, dec, steps, rng)
        want = mv(dec.decode(data), sample_rng(0, 0, i))
        for x, y in zip(got, want):
            assert np.abs(x.astype(np.int16) - y).max() <= 1, steps.plan
    assert "region" in kinds, kinds


def test_a_dct_scaled_decode_serves_every_view_within_the_crop_tolerance(planner_reset):
    """Against the same crops of a full decode: the tolerance of the single-crop DCT plans
    (tests/test_decode_plan.py: mean <= 1.5, worst image <= 5 levels of 255)."""
    plan.set_planner(plan.Planner(costs.DEFAULT_COSTS, region=False))
    mv = T.MultiView([T.train(96, scale=(0.4, 1)), T.train(48, scale=(0.1, 0.4))], counts=[2, 3])
    dec, diffs, scaled = get_decoder(), [], 0
    for i, data in enumerate(photo_jpegs((600, 1200), 1, seed=9)):
        steps = mv.plan_decode(data, dec, sample_rng(0, 0, i))
        scaled += steps.plan.scale < 1
        s = float(steps.plan.scale)
        for c in steps.crops:  # a DCT scale only where every crop keeps MIN_RATIO of its output, at its exact phase
            assert s == 1 or min(c.height / c.out_h, c.width / c.out_w) * s >= plan.MIN_RATIO
            assert s == 1 or max(phase_error(c.top * s, c.height * s / c.out_h),
                                 phase_error(c.left * s, c.width * s / c.out_w)) <= PHASE_TOL
        got = mv.decode(data, dec, sample_rng(0, 0, i))
        want = mv(dec.decode(data), sample_rng(0, 0, i))
        diffs += [np.abs(x.astype(np.int16) - y).mean() for x, y in zip(got, want)]
    diffs = np.array(diffs)
    assert scaled >= 3, "too few DCT-scaled plans to test"
    assert diffs.mean() <= 1.5 and diffs.max() <= 5, (diffs.mean(), diffs.max())


def test_the_shared_plan_suits_every_crop():
    p = plan.Planner(costs.DEFAULT_COSTS, region=False)
    header = read_header(jpeg_bytes(make_image(2, 1200, 1600)))
    big, small = Crop(0, 0, 1200, 1600, 160, 160), Crop(100, 100, 190, 190, 160, 160)
    assert p.choose(header, [big]) == p.choose(header, big)
    assert p.choose(header, big).scale < 1 and p.choose(header, [big, big]).scale < 1
    # The small crop has no pixels to spare: the one decode is full size, for both.
    assert p.choose(header, [big, small]).scale == 1
    assert p.choose(header, [big, big], scales=False).scale == 1
    regional = plan.Planner(costs.DEFAULT_COSTS, region=True)
    corner = [Crop(10, 20, 100, 120, 32, 32), Crop(150, 40, 90, 60, 32, 32)]
    shared = regional.choose(header, corner)
    assert shared.kind == "region" and shared.region == (10, 20, 240, 140)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="counts"):
        T.MultiView([T.train(32), T.train(16)], counts=[2])
    with pytest.raises(ValueError, match="counts"):
        T.MultiView([T.train(32)], counts=[0])
    with pytest.raises(TypeError, match="list of pipelines"):
        T.MultiView(T.train(32))
    with pytest.raises(TypeError, match="another MultiView"):
        T.MultiView([multicrop()])
    with pytest.raises(ValueError, match="p must be"):
        T.RandomApply([T.RandomHorizontalFlip()], p=1.5)


def test_as_compose_keeps_a_pipeline_that_plans_its_decode():
    """A MultiView or a Compose is a dataset's transform as it is; anything else is wrapped in a
    Compose, a user's transform with methods named plan_decode / finish_decode too."""
    mv, c = multicrop(), T.Compose([T.RandomResizedCrop(16)])
    assert T.as_compose(mv) is mv and T.as_compose(c) is c

    class Lookalike:
        def __call__(self, img, rng):
            return img

        def plan_decode(self, *args, **kwargs):
            raise AssertionError("not a pipeline of fastload's")

        finish_decode = plan_decode

    user = Lookalike()
    wrapped = T.as_compose(user)
    assert isinstance(wrapped, T.Compose) and wrapped.transforms == [user]
    assert T.as_compose(None).transforms == [] and T.as_compose([user]).transforms == [user]


def test_random_apply_applies_with_probability_p():
    img = make_image(5, 8, 10)
    flip = T.RandomApply([T.RandomHorizontalFlip(1.0)], p=0.3)
    applied = [not np.array_equal(flip(img, sample_rng(0, 0, i)), img) for i in range(2000)]
    assert abs(np.mean(applied) - 0.3) < 0.04


# ---- the batch path ------------------------------------------------------------------------


def test_fast_collate_batches_each_view():
    rng = np.random.default_rng(0)
    samples = [((rng.integers(0, 255, (8, 8, 3), np.uint8), rng.integers(0, 255, (4, 4, 3), np.uint8)), i)
               for i in range(3)]
    (big, small), labels = fast_collate(samples, pin=False)
    assert big.shape == (3, 8, 8, 3) and small.shape == (3, 4, 4, 3) and labels.tolist() == [0, 1, 2]
    for i, ((a, b), _) in enumerate(samples):
        assert np.array_equal(big[i].numpy(), a) and np.array_equal(small[i].numpy(), b)


def test_a_process_buffer_holds_every_view_and_is_reused():
    table = BufferTable(1, 1)
    shape = ((4, 8, 8, 3), (4, 4, 4, 3))
    (a, b), lease = table.buffer(0, shape)
    assert a.shape == shape[0] and b.shape == shape[1] and lease is not None
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # one buffer
    assert b.data_ptr() - a.data_ptr() == a.numel()  # one after the other, not overlapping
    a.fill_(1)
    b.fill_(2)
    assert int(a.sum()) == a.numel() and int(b.sum()) == 2 * b.numel()
    table.free(0, lease.buffer, lease.owner)
    (a2, _), lease2 = table.buffer(0, shape)
    assert lease2.buffer == lease.buffer and a2.data_ptr() == a.data_ptr() and table.counts == (1, 0)


def test_pinning_a_batch_pins_every_view(monkeypatch):
    """No accelerator here, so pinning is a recorded copy: every view goes through it."""
    pinned = []

    def fake_pin(t):
        pinned.append(tuple(t.shape))
        return t.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    released = []

    class Lease:
        def release(self, event=None):
            released.append(event)

    views = (torch.zeros(2, 8, 8, 3, dtype=torch.uint8), torch.ones(2, 4, 4, 3, dtype=torch.uint8))
    batch = HostBatch(views, torch.zeros(2, dtype=torch.int64), torch.arange(2), 0, lease=Lease())
    out = batch.pin_memory()
    assert (2, 8, 8, 3) in pinned and (2, 4, 4, 3) in pinned and released == [None]
    assert len(out) == 2 and [tuple(v.shape) for v in out.images] == [(2, 8, 8, 3), (2, 4, 4, 3)]
    assert out.images[0].data_ptr() != views[0].data_ptr() and out.lease is None


def test_thread_ring_pins_every_view(monkeypatch, root):
    """The thread backend's reused buffers are pinned for every view (here recorded, unpinned)."""
    asked = []
    real = ring.alloc_batch

    def alloc(shape, dtype=torch.uint8, pin=None):
        asked.append((tuple(shape), pin))
        return real(shape, dtype, pin=False)

    monkeypatch.setattr(ring, "alloc_batch", alloc)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # pinning is asked only with CUDA
    ds = fl.ImageFolder(root, transform=multicrop(n_global=1, n_local=2))
    with fl.Loader(ds, batch_size=4, num_workers=1, backend="thread", device="cpu", pin_memory=True) as loader:
        views, _ = next(iter(loader))
    assert ((4, 64, 64, 3), True) in asked and ((4, 32, 32, 3), True) in asked
    assert [tuple(v.shape) for v in views] == [(4, 3, 64, 64), (4, 3, 32, 32), (4, 3, 32, 32)]


def _run(root, epochs=2, **options):
    ds = fl.ImageFolder(root, transform=multicrop(n_global=2, n_local=3))
    out = []
    with fl.Loader(ds, batch_size=8, device="cpu", seed=11, shuffle=True, **options) as loader:
        for _ in range(epochs):
            out += [([v.clone() for v in views], y.clone()) for views, y in loader]
    return out


def _same(a, b):
    assert len(a) == len(b)
    for (va, ya), (vb, yb) in zip(a, b):
        assert torch.equal(ya, yb) and len(va) == len(vb)
        assert all(torch.equal(x, y) for x, y in zip(va, vb))


def test_views_are_reproducible_across_backends_and_worker_counts(root):
    want = _run(root, backend="thread", num_workers=1)
    assert len(want) == 6 and len(want[0][0]) == 5
    _same(_run(root, backend="thread", num_workers=2), want)
    _same(_run(root, backend="process", num_workers=2), want)
    _same(_run(root, num_workers=0), want)


def test_the_views_of_a_batch_are_those_of_its_samples(root):
    """Each row of each view is the view its sample's transform made (return_index gives the sample)."""
    mv = multicrop(n_global=1, n_local=2)
    ds = fl.ImageFolder(root, transform=mv)
    with fl.Loader(ds, batch_size=4, device="cpu", normalize=False, num_workers=1, backend="process",
                   return_index=True, seed=2) as loader:
        for views, y, idx in loader:
            for j, i in enumerate(idx.tolist()):
                want, label = ds.load(i, loader.epoch, 2)
                assert int(y[j]) == label
                for k, v in enumerate(views):
                    assert torch.equal(v[j].permute(1, 2, 0), torch.from_numpy(np.ascontiguousarray(want[k])))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_broken_image_is_skipped_with_all_its_views(tmp_path, backend):
    root = write_folder(tmp_path, num_classes=1, per_class=7, size=(100, 120))
    with open(os.path.join(root, "c0", "002.jpg"), "wb") as f:
        f.write(b"\xff\xd8 not a jpeg")
    ds = fl.ImageFolder(root, transform=multicrop(n_global=1, n_local=2))
    with fl.Loader(ds, batch_size=7, num_workers=2, backend=backend, device="cpu", on_error="skip") as loader:
        with pytest.warns(RuntimeWarning, match="skipped 1 bad sample"):
            batches = list(loader)
        assert [s.index for s in loader.skipped] == [2]
    (views, y), = batches
    assert [tuple(v.shape) for v in views] == [(7, 3, 64, 64), (7, 3, 32, 32), (7, 3, 32, 32)]


def test_resume_hands_out_the_views_that_would_have_come(root):
    want = _run(root, epochs=1, backend="thread", num_workers=2)
    ds = fl.ImageFolder(root, transform=multicrop(n_global=2, n_local=3))
    opts = dict(batch_size=8, device="cpu", seed=11, shuffle=True)
    with fl.Loader(ds, backend="process", num_workers=2, **opts) as a:
        it = iter(a)
        head = [([v.clone() for v in views], y.clone()) for _, (views, y) in zip(range(1), it)]
        state = a.state_dict()
    with fl.Loader(ds, backend="thread", num_workers=1, **opts) as b:
        b.load_state_dict(state)
        rest = [([v.clone() for v in views], y.clone()) for views, y in b]
    _same(head + rest, want)


def test_a_plain_dataloader_gets_a_list_of_view_batches(root):
    ds = fl.ImageFolder(root, transform=multicrop(n_global=1, n_local=2))
    views, y = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert [tuple(v.shape) for v in views] == [(4, 64, 64, 3), (4, 32, 32, 3), (4, 32, 32, 3)]


def test_a_wrapped_dataset_makes_views_too():
    images = [make_image(i, 90, 120) for i in range(6)]
    data = [(img, i % 2) for i, img in enumerate(images)]
    ds = fl.WrappedDataset(data, transform=multicrop(n_global=1, n_local=1))
    with fl.Loader(ds, batch_size=3, device="cpu") as loader:
        batches = list(loader)
    assert len(batches) == 2 and [tuple(v.shape) for v in batches[0][0]] == [(3, 3, 64, 64), (3, 3, 32, 32)]


def test_single_view_batches_are_unchanged(root):
    """A plain pipeline still gives one tensor per batch (not a list of one)."""
    with fl.Loader(fl.ImageFolder(root, transform=T.train(32)), batch_size=4, device="cpu") as loader:
        x, _ = next(iter(loader))
    assert isinstance(x, torch.Tensor) and x.shape == (4, 3, 32, 32)


# ---- DINO's preset (its photometric ops are fastload.transforms.color's) ------------------


def _dino(**kw):
    return T.dino(**kw)


def test_dino_follows_dinos_recipe():
    mv = _dino(n_local=8)
    assert mv.num_views == 10 and mv.counts == (1, 1, 8)
    (g1, g2, local) = [p.transforms for p in mv.pipelines]
    assert [t.size for t in (g1[0], g2[0], local[0])] == [(224, 224), (224, 224), (96, 96)]
    assert g1[0].scale == g2[0].scale == (0.4, 1.0) and local[0].scale == (0.05, 0.4)
    names = [[type(t).__name__ for t in ts] for ts in (g1, g2, local)]
    assert names[0][1:4] == ["RandomHorizontalFlip", "RandomApply", "RandomGrayscale"] == names[2][1:4]
    assert names[1] == names[0] + ["RandomSolarize"] and g2[-1].threshold == 128 and g2[-1].p == 0.2
    jitter = g1[2].transforms[0]
    assert g1[2].p == 0.8 and type(jitter).__name__ == "ColorJitter" and jitter.hue == (-0.1, 0.1)
    assert g1[3].p == 0.2
    assert [ts[4].p for ts in (g1, g2, local)] == [1.0, 0.1, 0.5]  # the blur's probability per kind of view
    assert _dino(n_local=0).num_views == 2
    with pytest.raises(ValueError, match="n_local"):
        _dino(n_local=-1)


def test_a_dino_training_loop(root):
    transform = _dino(global_size=64, local_size=32, n_local=4)
    got = []
    for backend, workers in (("thread", 1), ("process", 2)):
        with fl.Loader(fl.ImageFolder(root, transform=transform), batch_size=8, device="cpu", seed=4,
                       backend=backend, num_workers=workers) as loader:
            batches = [([v.clone() for v in views], y.clone()) for views, y in loader]
        assert len(batches) == 3
        for views, y in batches:
            assert len(views) == 6 and y.dtype == torch.int64
            assert [tuple(v.shape[1:]) for v in views] == [(3, 64, 64)] * 2 + [(3, 32, 32)] * 4
            assert all(v.dtype == torch.float32 and v.is_contiguous(memory_format=torch.channels_last)
                       and torch.isfinite(v).all() for v in views)
        got.append(batches)
    _same(got[0], got[1])  # jitter, grayscale, blur, solarize: drawn from (seed, epoch, index) too


def test_webdataset_shards_make_views_too(tmp_path, monkeypatch):
    pytest.importorskip("webdataset")
    from wds_servers import write_shards

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    write_shards(tmp_path / "data", [5, 7], size=(60, 80))
    ds = fl.WebDataset(str(tmp_path / "data" / "shard-{000000..000001}.tar"), multicrop(n_global=1, n_local=2))
    by_sample = []
    for workers in (1, 2):  # batches are per worker slot: compare the views sample by sample
        with fl.Loader(ds, batch_size=4, device="cpu", seed=3, num_workers=workers) as loader:
            batches = [([v.clone() for v in views], y.clone()) for views, y in loader]
        assert [tuple(v.shape[1:]) for v in batches[0][0]] == [(3, 64, 64), (3, 32, 32), (3, 32, 32)]
        by_sample.append({int(t): [v[j] for v in views] for views, y in batches for j, t in enumerate(y)})
    assert sorted(by_sample[0]) == list(range(12)) and sorted(by_sample[1]) == list(range(12))
    for n, views in by_sample[0].items():
        assert all(torch.equal(a, b) for a, b in zip(views, by_sample[1][n])), n


def test_views_are_resized_straight_into_their_batch_rows(root):
    """Past the head of a pass (loaded beside its batch to learn the shapes), every view is
    resized into its row and flipped there: no copy."""
    mv = multicrop(n_global=2, n_local=3)
    with fl.Loader(fl.ImageFolder(root, transform=mv), batch_size=8, num_workers=1, backend="thread",
                   device="cpu") as loader:
        n = sum(len(y) for _, y in loader)
        copies = loader._source.copies
    assert n == 20 and copies == 2 * mv.num_views, copies  # the head: the 2 samples that agree on the shapes


@pytest.mark.skipif(not roi.available(), reason="GPU decode on the CPU needs nvImageCodec's CPU backend")
def test_gpu_decode_runs_dinos_geometry_as_the_cpu_path(root, monkeypatch):
    """Crops and flips only (tests/test_gpu_views.py has the rest): every view the CPU path's."""
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    ds = fl.ImageFolder(root, transform=multicrop(n_local=2, reduced_decode=False))
    got = {}
    for decode in ("cpu", "gpu"):
        with fl.Loader(ds, batch_size=8, device="cpu", normalize=False, decode=decode, num_workers=0, seed=1) as ld:
            got[decode] = [(tuple(v.clone() for v in x), y.clone()) for x, y in ld]
    assert [tuple(v.shape[1:]) for v in got["gpu"][0][0]] == [(3, 64, 64)] * 2 + [(3, 32, 32)] * 2
    for (xg, yg), (xc, yc) in zip(got["gpu"], got["cpu"], strict=True):
        assert torch.equal(yg, yc) and all(torch.equal(a, b) for a, b in zip(xg, xc, strict=True))


def test_gpu_decode_refuses_a_view_it_cannot_run_naming_it_and_the_cpu_path(root, monkeypatch):
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")  # past the device check, to the transforms'
    with pytest.raises(ValueError, match=r"decode='gpu' runs at most a RandomHorizontalFlip.*pipeline 0 of MultiView.*"
                                         r"decode='cpu'"):
        fl.Loader(fl.ImageFolder(root, transform=T.dino(32, 16, n_local=2)), batch_size=4, device="cpu", decode="gpu")
