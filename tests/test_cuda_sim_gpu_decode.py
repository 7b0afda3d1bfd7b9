"""Loader(decode="gpu") on simulated GPUs, nvImageCodec replaced by tests/cudasim/decoder.py."""

import os

import numpy as np
import pytest
import torch

import fastload as fl
from conftest import jpeg_bytes, make_image
from cudasim import decoder
from cudasim.scenes import read_on_consumer
from fastload.decode import roi

pytestmark = pytest.mark.skipif(not roi.available(), reason="the stand-in decoder uses nvImageCodec's CPU backend")


@pytest.fixture
def photos(tmp_path, monkeypatch):
    return make_photos(tmp_path, monkeypatch)


def make_photos(tmp_path, monkeypatch):
    """A small ImageFolder of JPEGs, and the stand-in decoder patched in."""
    os.makedirs(tmp_path / "a")
    for i in range(24):
        (tmp_path / "a" / f"{i:02d}.jpg").write_bytes(jpeg_bytes(make_image(i, 60 + 3 * i, 80 + 2 * i)))
    monkeypatch.setattr("fastload.device.gpudecode.executor.BatchDecoder", decoder.decoder)
    return fl.ImageFolder(str(tmp_path), fl.transforms.train(32, reduced_decode=False))


def gpu_loader(ds, **kw):
    opts = dict(decode="gpu", batch_size=6, num_workers=2, shuffle=True, seed=0, stall_warning=0, device="cuda")
    opts.update(kw)
    return fl.Loader(ds, **opts)


def test_gpu_decode_batches_are_read_safely_and_equal_the_cpu_stand_in(sim, photos, monkeypatch):
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    with gpu_loader(photos, device="cpu", normalize=False) as cpu:
        want = [x.clone() for x, _ in cpu]
    got = []
    with gpu_loader(photos, normalize=False) as ld:
        for x, y in ld:
            assert x.device == torch.device("cuda", 0)
            read_on_consumer(x, y)
            got.append(x.cpu())
    assert len(got) == len(want)
    for g, w in zip(got, want):  # the CUDA path resizes in float32, rounded once: within a level
        assert (g.float() - w.float()).abs().mean() <= 1.0


def test_gpu_decode_consumer_drops_each_batch(sim, photos):
    with gpu_loader(photos) as ld:
        for _ in range(2):
            for x, y in ld:
                x.mul(2), y.add(1)
                del x, y
    assert sim.allocator.reused > 0


def test_gpu_decode_of_a_ddp_rank_runs_on_its_gpu(sim, photos, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with gpu_loader(photos, device=None) as ld:
        for x, y in ld:
            assert x.device == torch.device("cuda", 1)
            with torch.cuda.device(1):
                read_on_consumer(x, y)
    assert sim.contexts == {1}


def test_7_the_training_thread_launches_no_decode_work(sim, photos):
    """The decoder call and its per-row kernels run on the driver's own thread: the training
    thread only waits for each batch's event (one launch per batch in the simulator's count)."""
    with gpu_loader(photos) as ld:
        batches = 0
        sim.launches.clear()
        for x, _ in ld:
            batches += 1
        training = sim.launches["MainThread"] / batches
    print(f"launches per batch: training thread {training:.1f}, all {sum(sim.launches.values()) / batches:.1f}")
    assert training <= 1.0, sim.launches


def test_rows_the_decoder_refuses_are_loaded_on_the_cpu_and_copied_safely(sim, photos, monkeypatch):
    monkeypatch.setattr(decoder.StandInDecoder, "refuse", frozenset({0, 3}))
    with gpu_loader(photos, gpu_cpu_share=0) as ld:  # every row to the decoder
        for _ in range(2):
            for x, y in ld:
                read_on_consumer(x, y)
        assert ld.stats()["cpu_fallback_rows"] == 2 * 2 * 4  # two rows of each of 4 batches, twice


def test_8_device_memory_counts_the_decoders_own_pool(sim, photos, monkeypatch):
    """The flat-memory check of test_gpu_decode.py reads the driver's count (mem_get_info),
    which holds nvImageCodec's buffers; memory_reserved() does not see a leak there."""
    from conftest import device_memory_per_epoch

    monkeypatch.setattr(decoder.StandInDecoder, "leak", 2**20)  # a decoder keeping 1 MiB per batch
    with gpu_loader(photos, normalize=False, gpu_cpu_share=0) as ld:  # a decoder call every batch
        memory = device_memory_per_epoch(ld, 3)
    outside = [used - reserved for used, reserved in memory]  # what memory_reserved() cannot see
    assert outside[2] - outside[1] == 4 * 2**20  # 4 batches an epoch


def test_close_with_decode_work_in_flight_waits_for_it(sim, photos):
    ld = gpu_loader(photos)
    read_on_consumer(*next(iter(ld)))
    driver = ld._driver
    ld.close()
    assert driver._side and all(sim.knows(s) for s in driver._side)


def test_a_decoder_error_on_the_driver_thread_reaches_the_training_loop(sim, photos, monkeypatch):
    def broken(self, batch, cuda_stream=0):
        raise MemoryError("decoder pool exhausted")

    monkeypatch.setattr(decoder.StandInDecoder, "decode", broken)
    with gpu_loader(photos) as ld, pytest.raises(MemoryError, match="pool exhausted"):
        next(iter(ld))


# --- the GPU decode executor run by the device driver: its passes, devices and hook ------------


def _halve_in_place(images, targets, generator):
    """A batch transform writing into the handed-over batch, on the consumer's stream."""
    return images.mul_(0.5), targets


def test_gpu_decode_batch_transforms_run_after_the_wait_and_match_the_cpu_stand_in(sim, photos, monkeypatch):
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    with gpu_loader(photos, device="cpu", batch_transform=_halve_in_place) as cpu:
        want = [x.clone() for x, _ in cpu]
    got = []
    with gpu_loader(photos, batch_transform=_halve_in_place) as ld:
        for x, y in ld:
            read_on_consumer(x, y)
            got.append(x.cpu())
    assert len(got) == len(want)
    for g, w in zip(got, want):  # halved normalized values: the float resize's level, halved, and no more
        assert (g - w).abs().mean() <= 0.5 / 255 / min(fl.Normalize().std)


def test_gpu_decode_pass_broken_off_leaves_nothing_for_the_next(sim, photos):
    # A fixed share: which rows the workers decode (within a level of the GPU's) is the same every run.
    with gpu_loader(photos, gpu_cpu_share=0.5) as whole:
        whole.set_epoch(1)
        want = [(x.cpu(), y.cpu()) for x, y in whole]
    with gpu_loader(photos, gpu_cpu_share=0.5) as ld:
        for i, (x, y) in enumerate(ld):
            read_on_consumer(x, y)
            if i == 1:
                break  # batches queued on the driver's thread are dropped or cancelled
        got = [(x.cpu(), y.cpu()) for x, y in ld]
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)


@pytest.mark.sim(seed=0)
@pytest.mark.parametrize("seed", [1, 2])
def test_gpu_decode_is_race_free_when_work_completes_in_random_orders(sim, photos, seed):
    sim.rng.seed(seed)
    with gpu_loader(photos, prefetch_factor=1) as ld:
        for _ in range(2):
            for x, y in ld:
                read_on_consumer(x, y)


def test_gpu_decode_follows_set_device_between_passes(sim, photos):
    """An unindexed device: the next pass decodes on the GPU the program chose since, with a
    new driver (its thread, stream and decoder on that GPU)."""
    with gpu_loader(photos, device="cuda") as ld:
        first = [read_on_consumer(x, y)[0].cpu() for x, y in ld]
        torch.cuda.set_device(1)
        try:
            second = []
            for x, y in ld:
                assert x.device == torch.device("cuda", 1)
                second.append(read_on_consumer(x, y)[0].cpu())
        finally:
            torch.cuda.set_device(0)
    assert len(first) == len(second) and sim.contexts == {0, 1}


def test_driver_close_waits_for_the_batch_its_thread_is_on_and_no_longer(sim):
    """A pass broken off cancels the batches queued behind the one the driver's thread is on.
    close() waits for that one (its work goes on the stream) and no longer: it waited for the
    batch submitted last, which was cancelled, and so for CLOSE_WAIT_S (2 s) every time."""
    import time

    from fastload.collate import fast_collate
    from fastload.device.copy import HostCopy
    from fastload.device.driver import CLOSE_WAIT_S, DeviceDriver

    staged = []

    class SlowThreadedCopy(HostCopy):  # a threaded executor (as GPU decode) whose batches take a while
        threads = 1

        def stage(self, item, at):
            staged.append(item)
            if len(staged) > 1:  # all but the first
                time.sleep(0.3)
            return super().stage(item, at)

    rng = np.random.default_rng(0)
    batches = [fast_collate([(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8), j) for j in range(4)], pin=True)
               for _ in range(5)]
    driver = DeviceDriver(SlowThreadedCopy(), "cuda")
    passing = driver.run(batches)
    read_on_consumer(*next(passing))  # batch 0 handed over; 1 and 2 submitted to the thread
    time.sleep(0.1)
    assert len(staged) == 2  # the thread is on batch 1, batch 2 waits behind it
    passing.close()  # the pass is broken off: batch 2 is cancelled, batch 1 runs on
    start = time.monotonic()
    driver.close()
    took = time.monotonic() - start
    time.sleep(0.5)  # batch 1 has ended by now, had close() not waited for it
    assert driver._side and all(sim.knows(s) for s in driver._side), (
        "batch 1 queued work on the stream after close() returned"
    )
    assert len(staged) == 2  # batch 2 never ran
    assert took < CLOSE_WAIT_S * 0.75, f"close() took {took:.1f} s: it waited for a cancelled batch"


def test_threads_decode_batches_at_once_on_their_own_streams_and_hand_them_over_in_order(sim):
    """An executor with threads=3 stages three batches at once, each driver thread on a stream
    of its own; batches that finish out of order are still handed over in the source's order,
    and the consumer reads each only after its own event (no race in the simulator)."""
    import threading
    import time

    from fastload.collate import fast_collate
    from fastload.device.copy import HostCopy
    from fastload.device.driver import DeviceDriver

    lock, running, most, streams = threading.Lock(), [0], [0], set()

    class ThreeThreads(HostCopy):
        threads = 3

        def stage(self, item, at):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                streams.add(id(at.stream))
            time.sleep(0.05 * (3 - int(item[1][0]) % 3))  # later batches finish first
            with lock:
                running[0] -= 1
            return super().stage(item, at)

    rng = np.random.default_rng(0)
    batches = [fast_collate([(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8), b) for _ in range(4)], pin=True)
               for b in range(9)]
    want = [b[0].clone() for b in batches]
    with DeviceDriver(ThreeThreads(), "cuda", normalizer=lambda x: x) as driver:
        got = []
        for x, y in driver.run(batches):
            read_on_consumer(x, y)
            got.append((int(y.cpu()[0]), x.cpu()))
    assert [label for label, _ in got] == list(range(9))
    for (_, x), w in zip(got, want):
        assert torch.equal(x, w)
    assert most[0] == 3, f"at most {most[0]} batches were staged at once"
    assert len(streams) == 3 and id(driver._stream) not in streams
    assert not sim.races, sim.races


def test_gpu_decode_views_are_read_safely_and_equal_the_cpu_stand_in(sim, photos, monkeypatch):
    """A MultiView on the device: one decode per image, a uint8 buffer per view written on the
    driver thread's stream (refused rows' views copied in too), each read safely by the training loop."""
    views = fl.transforms.MultiView([fl.transforms.train(32, reduced_decode=False),
                                     fl.transforms.train(16, scale=(0.05, 0.3), reduced_decode=False)], counts=[1, 2])
    ds = fl.ImageFolder(photos.root, views)
    monkeypatch.setattr(decoder.StandInDecoder, "refuse", frozenset({0, 3}))
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    with gpu_loader(ds, device="cpu", normalize=False, gpu_cpu_share=0) as cpu:
        want = [[v.clone() for v in x] for x, _ in cpu]
    got = []
    with gpu_loader(ds, normalize=False, gpu_cpu_share=0) as ld:
        for x, y in ld:
            assert [tuple(v.shape[1:]) for v in x] == [(3, 32, 32), (3, 16, 16), (3, 16, 16)]
            for v in x:
                assert v.device == torch.device("cuda", 0)
                read_on_consumer(v, y)
            got.append([v.cpu() for v in x])
        assert ld.stats()["cpu_fallback_rows"] == 2 * 4  # two rows of each of 4 batches
    assert len(got) == len(want)
    for g, w in zip(got, want):  # the CUDA path resizes in float32, rounded once: within a level
        for gv, wv in zip(g, w):
            assert (gv.float() - wv.float()).abs().mean() <= 1.0
