import time

import numpy as np
import pytest
import torch

from fastload.config import IMAGENET_MEAN, IMAGENET_STD
from fastload.device.prefetch import CudaPrefetcher, Normalizer


def _batches(n=3, size=(4, 6, 5, 3), seed=0, pin=False):
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        x = torch.randint(0, 256, size, dtype=torch.uint8, generator=g)
        yield (x.pin_memory() if pin else x), torch.arange(size[0]) + i


def _reference(x_nhwc: torch.Tensor) -> np.ndarray:
    x = x_nhwc.numpy().astype(np.float64) / 255.0
    return ((x - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)).transpose(0, 3, 1, 2)


def test_cpu_numerics_match_float64_reference():
    src = list(_batches())
    out = list(CudaPrefetcher(src, device="cpu"))
    for (x, _), (y, labels) in zip(src, out):
        assert y.dtype == torch.float32 and y.shape == (4, 3, 6, 5)
        assert y.is_contiguous(memory_format=torch.channels_last)
        np.testing.assert_allclose(y.numpy(), _reference(x), rtol=0, atol=4e-6)  # float32 rounding
    assert [lab.tolist() for _, lab in out] == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]


@pytest.mark.parametrize("dtype,atol", [("float16", 4e-3), ("bfloat16", 3e-2)])
def test_reduced_precision_dtypes(dtype, atol):
    x, _ = next(_batches())
    y = Normalizer(dtype=dtype)(x)
    assert y.dtype == getattr(torch, dtype) and y.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_allclose(y.float().numpy(), _reference(x), rtol=0, atol=atol)


def test_uint8_passthrough_layout():
    x, _ = next(_batches())
    y = Normalizer(normalize=False)(x)
    assert y.dtype == torch.uint8 and torch.equal(y, x.permute(0, 3, 1, 2))
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_bad_input_and_arguments():
    with pytest.raises(TypeError, match="uint8"):
        Normalizer()(torch.zeros(2, 3, 4, 3))
    with pytest.raises(ValueError, match="channels"):
        Normalizer()(torch.zeros(2, 3, 4, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="dtype"):
        Normalizer(dtype="float64")
    with pytest.raises(ValueError, match="depth"):
        CudaPrefetcher([], depth=0)


def test_a_prefetcher_serves_the_device_it_was_made_for():
    """Its public methods: iterate, run and close. A device change is a new prefetcher, as the
    Loader makes a new driver (set_device, which nothing called, was removed)."""
    public = {name for name in dir(CudaPrefetcher) if not name.startswith("_")}
    assert public == {"close", "run"}, public


def test_producer_errors_reach_the_consumer():
    def broken():
        yield from _batches(1)
        raise OSError("disk went away")

    it = iter(CudaPrefetcher(broken(), device="cpu"))
    next(it)
    with pytest.raises(OSError, match="disk went away"):
        next(it)


def test_stats_count_wait_time_and_close_is_idempotent():
    def slow():
        for b in _batches(3):
            time.sleep(0.05)
            yield b

    p = CudaPrefetcher(slow(), device="cpu")
    for _ in p:
        time.sleep(0.01)
    stats = p.stats.as_dict()
    assert stats["batches"] == 3 and stats["wait_s"] >= 0.14
    assert 0.5 < stats["wait_share"] <= 1.0
    p.close()
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(p))


# ---- CUDA (skipped without a GPU; run by make gpu-check) ----


@pytest.mark.cuda
def test_cuda_numerics_match_cpu():
    src = list(_batches(pin=True))
    gpu = [(y.cpu(), lab.cpu()) for y, lab in CudaPrefetcher(src, device="cuda")]
    cpu = list(CudaPrefetcher(src, device="cpu"))
    for (g, gl), (c, cl) in zip(gpu, cpu):
        assert g.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(g, c, rtol=0, atol=1e-6)
        assert torch.equal(gl, cl)


# These tests keep the consumer asynchronous (no .item(), no synchronize until the end)
# and delay the *side* stream, so a missing wait, record_stream or buffer gate shows up
# as wrong sums instead of being hidden by a host sync.

LONG = 20_000_000  # torch.cuda._sleep cycles: milliseconds of GPU time


class _SlowNormalizer(Normalizer):
    """Normalizes after a long kernel on the (side) stream it runs on."""

    def __call__(self, images):
        torch.cuda._sleep(LONG)
        return super().__call__(images)


def _expected_sums(src, normalizer):
    return torch.stack([normalizer(x.cuda()).double().sum().cpu() for x, _ in src])


@pytest.mark.cuda
def test_cuda_consumer_waits_for_each_batch():
    """Fails without the consumer's wait on the batch's ready event."""
    src = list(_batches(20, (8, 32, 32, 3), pin=True))
    want = _expected_sums(src, Normalizer())
    got = torch.zeros(len(src), dtype=torch.float64, device="cuda")
    for i, (y, _) in enumerate(CudaPrefetcher(src, device="cuda", depth=3, normalizer=_SlowNormalizer())):
        got[i] = y.double().sum()  # queued on the consumer stream: no host sync
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.cuda
def test_cuda_freed_outputs_are_not_reused_while_the_consumer_reads():
    """Fails without record_stream: a freed output block would be refilled by the side
    stream while the consumer's (delayed) read of it is still queued."""
    src = list(_batches(30, (8, 32, 32, 3), pin=True))
    want = _expected_sums(src, Normalizer())
    got = torch.zeros(len(src), dtype=torch.float64, device="cuda")
    for i, (y, _) in enumerate(CudaPrefetcher(src, device="cuda", depth=2)):
        torch.cuda._sleep(LONG)  # the consumer's step runs long...
        got[i] = y.double().sum()  # ...then reads the batch; y is dropped right away
        del y
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.cuda
def test_cuda_reused_host_buffer_waits_for_its_copy():
    """Fails if a ring buffer is handed back before its host-to-device copy ran: batch i
    is filled with i, and the copy of each batch is held back on the side stream."""
    from fastload.batch import HostBatch
    from fastload.sources.ring import BufferRing, RingLease

    ring = BufferRing(1, (4, 8, 8, 3), pin=True)
    side = torch.cuda.Stream()
    n = 12

    def source():
        for i in range(n):
            slot = ring.acquire(None)  # waits for the previous copy's event
            bufs = ring.buffers(slot)
            bufs.images.fill_(i)
            bufs.labels.fill_(i)
            with torch.cuda.stream(side):
                torch.cuda._sleep(LONG)  # the copy of this batch starts late
            yield HostBatch(bufs.images, bufs.labels, bufs.indices, 0, (), RingLease(ring, slot))

    got = torch.zeros(n, dtype=torch.float64, device="cuda")
    prefetcher = CudaPrefetcher(source(), device="cuda", depth=2, normalizer=Normalizer(normalize=False),
                                stream=side)
    for i, (y, labels) in enumerate(prefetcher):
        got[i] = y.double().mean() + labels.double().mean()
    torch.testing.assert_close(got.cpu(), 2 * torch.arange(n, dtype=torch.float64))


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["process", "thread"])
def test_cuda_loader_batches_equal_the_cpu_path(folder, backend):
    import fastload as fl

    ds = fl.ImageFolder(folder, transform=fl.transforms.train(24))
    opts = dict(batch_size=5, num_workers=2, shuffle=True, seed=3, backend=backend, normalize=False)
    with fl.Loader(ds, device="cpu", **opts) as cpu, fl.Loader(ds, device="cuda", **opts) as gpu:
        for (cx, cy), (gx, gy) in zip(cpu, gpu):
            assert torch.equal(cx, gx.cpu()) and torch.equal(cy, gy.cpu())
        with fl.Loader(ds, device="cuda", **{**opts, "normalize": True}) as norm:
            with fl.Loader(ds, device="cpu", **{**opts, "normalize": True}) as cnorm:
                for (cx, _), (gx, _) in zip(cnorm, norm):
                    torch.testing.assert_close(gx.cpu(), cx, rtol=0, atol=1e-6)


@pytest.mark.cuda
def test_cuda_reserved_memory_is_flat_across_epochs():
    src = list(_batches(4, (16, 64, 64, 3), pin=True))
    p = CudaPrefetcher(src, device="cuda")
    reserved = []
    for _ in range(50):
        for y, _ in p:
            (y * 2).sum()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert reserved[-1] == reserved[5], reserved


@pytest.mark.cuda
def test_cuda_unpinned_batches_are_counted_and_errors_propagate():
    def gen():
        yield from _batches(2, pin=False)
        raise ValueError("bad batch")

    p = CudaPrefetcher(gen(), device="cuda")
    with pytest.warns(RuntimeWarning, match="unpinned"), pytest.raises(ValueError, match="bad batch"):
        list(p)
    assert p.stats.unpinned == 2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_abandoned_pass_does_not_leak_into_the_next(device):
    src = list(_batches(3, pin=device == "cuda"))
    p = CudaPrefetcher(src, device=device)
    first = next(iter(p))[1].cpu()
    again = [labels.cpu().tolist() for _, labels in p]
    assert first.tolist() == [0, 1, 2, 3] and again == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]


def test_a_users_batches_with_indices_pass_through(device="cpu"):
    src = [(x, y, torch.arange(4) + 10 * i, f"batch {i}") for i, (x, y) in enumerate(_batches())]
    out = list(CudaPrefetcher(src, device=device))
    assert [len(o) for o in out] == [4, 4, 4]
    for (x, y, idx, name), (got_x, got_y, got_idx, got_name) in zip(src, out):
        np.testing.assert_allclose(got_x.numpy(), _reference(x), rtol=0, atol=4e-6)
        assert torch.equal(got_y, y) and got_idx is idx and got_name == name


class _Lease:
    def __init__(self):
        self.released = []

    def release(self, event=None):
        self.released.append(event)


def _leased_batch(lease):
    from fastload.batch import HostBatch

    x, y = next(_batches(pin=torch.cuda.is_available()))
    return HostBatch(x, y, torch.arange(4), 0, (), lease)


def _failing(images):
    raise RuntimeError("normalizer failed")


def test_a_failing_normalizer_still_gives_the_buffer_back():
    lease = _Lease()
    with pytest.raises(RuntimeError, match="normalizer failed"):
        list(CudaPrefetcher([_leased_batch(lease)], device="cpu", normalizer=_failing))
    assert lease.released == [None]


@pytest.mark.cuda
def test_cuda_a_failing_normalizer_releases_the_buffer_with_its_copy_event():
    lease = _Lease()
    with pytest.raises(RuntimeError, match="normalizer failed"):
        list(CudaPrefetcher([_leased_batch(lease)], device="cuda", normalizer=_failing))
    assert len(lease.released) == 1 and isinstance(lease.released[0], torch.cuda.Event)
