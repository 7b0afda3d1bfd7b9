"""Loader(batch_transform=...): the same batches for any workers, backend or resume; the
user's own callables; clear errors for the callables fastload cannot call."""

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.augment import batch_generator, batch_seed
from fastload.datasets.base import sample_rng

OPTS = dict(batch_size=6, shuffle=True, seed=3, device="cpu")


class Tiles(fl.ImageDataset):
    """Sample i: a 12x16 image drawn from its own rng, class i % 10."""

    def __init__(self, n):
        super().__init__(np.arange(n, dtype=np.int64) % 10)

    def load(self, index, epoch=0, seed=0):
        return sample_rng(seed, epoch, index).integers(0, 256, (12, 16, 3), dtype=np.uint8), int(index % 10)


def _recipe(mixup_first=False):
    steps = [fl.augment.RandomErasing(0.5, mode="pixel", max_count=2),
             fl.augment.Mixup(0.8, 1.0, mode="elem", label_smoothing=0.1, num_classes=10)]
    return steps[::-1] if mixup_first else steps


def _epoch(loader):
    return [tuple(t.clone() for t in out) for out in loader]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y) and all(torch.equal(s, t) for s, t in zip(x, y))


def test_batches_do_not_depend_on_workers_or_backend():
    runs = []
    for kw in (dict(num_workers=0), dict(num_workers=2, backend="thread"), dict(num_workers=2, backend="process")):
        with fl.Loader(Tiles(40), batch_transform=_recipe(), return_index=True, **OPTS, **kw) as loader:
            runs.append([_epoch(loader), _epoch(loader)])
    for run in runs[1:]:
        for epoch in range(2):
            _same(runs[0][epoch], run[epoch])
    first, second = runs[0]
    assert not torch.equal(first[0][0], second[0][0])  # each epoch draws anew
    assert not torch.equal(first[0][0], first[1][0])  # and each batch
    assert first[0][1].shape == (6, 10) and first[0][0].dtype == torch.float32


def test_indices_are_unchanged_and_images_are_transformed():
    with fl.Loader(Tiles(40), return_index=True, **OPTS) as plain, \
            fl.Loader(Tiles(40), batch_transform=_recipe(), return_index=True, **OPTS) as mixed:
        for (x, y, i), (mx, my, mi) in zip(_epoch(plain), _epoch(mixed)):
            assert torch.equal(i, mi) and i.dtype == torch.int64
            assert not torch.equal(x, mx)
            # Each target is its own class mixed with its mirror's (smoothing 0.1 of 10 classes).
            rows, partner = torch.arange(len(y)), y.flip(0)
            mass = my[rows, y] + torch.where(partner != y, my[rows, partner], 0.0)
            assert torch.allclose(mass, torch.where(partner != y, 0.92, 0.91))


@pytest.mark.parametrize("mixup_first", [False, True])
def test_resume_gives_the_batches_of_the_uninterrupted_run(mixup_first):
    with fl.Loader(Tiles(40), batch_transform=_recipe(mixup_first), **OPTS) as loader:
        _epoch(loader)
        whole = _epoch(loader)  # epoch 1
    with fl.Loader(Tiles(40), batch_transform=_recipe(mixup_first), **OPTS) as loader:
        _epoch(loader)
        it = iter(loader)
        head = [tuple(t.clone() for t in next(it)) for _ in range(3)]
        state = loader.state_dict()
    _same(head, whole[:3])
    with fl.Loader(Tiles(40), batch_transform=_recipe(mixup_first), num_workers=2, backend="thread",
                   **OPTS) as resumed:
        resumed.load_state_dict(state)
        _same(_epoch(resumed), whole[3:])


def test_ranks_draw_apart_and_seeds_are_stable():
    assert batch_seed(3, 1, 5, rank=0) != batch_seed(3, 1, 5, rank=1)
    assert batch_seed(3, 1, 5, slot=0) != batch_seed(3, 1, 5, slot=1)
    assert batch_seed(3, 1, 5) == batch_seed(3, 1, 5) < 2**63
    assert len({batch_seed(s, e, b) for s in range(3) for e in range(3) for b in range(3)}) == 27
    a = torch.rand(4, generator=batch_generator(3, 1, 5))
    assert torch.equal(a, torch.rand(4, generator=batch_generator(3, 1, 5)))
    with fl.Loader(Tiles(24), batch_transform=_recipe(), shard=fl.Shard(rank=0, world_size=2), **OPTS) as r0, \
            fl.Loader(Tiles(24), batch_transform=_recipe(), shard=fl.Shard(rank=1, world_size=2), **OPTS) as r1:
        assert not torch.equal(next(iter(r0))[1], next(iter(r1))[1])


def test_batch_numbers_go_on_in_a_resumed_epoch():
    from fastload.loading.progress import Position
    from fastload.sources.resume import Stage

    assert Position(2, consumed=4).batch_number(0, 1) == 4
    resumed = Position(2, (Stage(2, (3, 5)),), consumed=1)
    assert resumed.batch_number(1, 2) == 6 and resumed.batch_number(0, 2) == 4  # each rank's own batches
    assert resumed.batch_number(0, 3) == 6  # re-dealt: after the most any rank handed out


def test_users_own_callable_gets_a_seeded_generator():
    seen = []

    def jitter(images, targets, generator):
        seen.append(generator.initial_seed())
        return images + torch.rand(images.shape[0], 1, 1, 1, generator=generator, device=generator.device), targets

    with fl.Loader(Tiles(12), batch_transform=jitter, num_workers=0, **OPTS) as loader:
        a = _epoch(loader)
        _epoch(loader)
        loader.set_epoch(0)
        b = _epoch(loader)
    _same(a, b)
    assert seen == [batch_seed(3, e, b) for e in (0, 1, 0) for b in (0, 1)]


class Brighten(torch.nn.Module):
    """An images-only module drawing from torch's global generator (as kornia's do)."""

    def forward(self, images):
        return images + torch.rand(images.shape[0], 1, 1, 1)


def test_images_only_callables_go_through_the_adapter():
    with pytest.raises(TypeError, match=r"batch_transform\[1\] \(Brighten\).*ImagesOnly"):
        fl.Loader(Tiles(12), batch_transform=[_recipe()[0], Brighten()], **OPTS)
    with pytest.raises(TypeError, match=r"batch_transform \(.*<lambda>\).*ImagesOnly"):
        fl.Loader(Tiles(12), batch_transform=lambda images: images, **OPTS)
    runs = []
    for program_seed in (1, 2):
        torch.manual_seed(program_seed)
        state = torch.get_rng_state()
        with fl.Loader(Tiles(12), batch_transform=fl.augment.ImagesOnly(Brighten()), num_workers=0, **OPTS) as loader:
            runs.append(_epoch(loader))
        assert torch.equal(torch.get_rng_state(), state)  # the program's own generator is left alone
    _same(*runs)
    with fl.Loader(Tiles(12), batch_transform=fl.augment.ImagesOnly(lambda x, y: (x * 2, y), targets=True),
                   num_workers=0, **OPTS) as loader:
        assert next(iter(loader))[0].shape == (6, 3, 12, 16)


def test_bad_batch_transforms_are_type_errors():
    with pytest.raises(TypeError, match="batch_transform must be a callable.*got int"):
        fl.Loader(Tiles(12), batch_transform=3, **OPTS)
    with pytest.raises(TypeError, match=r"batch_transform\[0\] must be a callable.*got str"):
        fl.Loader(Tiles(12), batch_transform=["mixup"], **OPTS)
    with fl.Loader(Tiles(12), batch_transform=lambda x, y, g: x, num_workers=0, **OPTS) as loader:
        with pytest.raises(TypeError, match=r"returned Tensor; it must return \(images, targets\)"):
            next(iter(loader))
    with pytest.raises(TypeError, match="unknown Loader option"):
        fl.LoaderConfig().replace(batch_transform=None)  # not a config field: configs are saved


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_outputs_stay_channels_last(dtype):
    with fl.Loader(Tiles(12), batch_transform=_recipe(), normalize=fl.Normalize(dtype=dtype), num_workers=0,
                   **OPTS) as loader:
        images, targets = next(iter(loader))
    assert images.dtype == getattr(torch, dtype) and images.is_contiguous(memory_format=torch.channels_last)
    assert targets.dtype == torch.float32 and torch.allclose(targets.sum(1), torch.ones(6))


@pytest.mark.cuda
def test_on_cuda_the_generator_is_on_the_device():
    devices = []

    def where(images, targets, generator):
        devices.append((images.device.type, generator.device.type))
        return images, targets

    with fl.Loader(Tiles(12), batch_transform=[where] + _recipe(), num_workers=0, batch_size=6, seed=1,
                   device="cuda") as loader:
        images, targets = next(iter(loader))
    assert devices == [("cuda", "cuda")] and images.is_cuda and targets.is_cuda
