"""The real Loader(device="cuda") on simulated GPUs (tests/cudasim): every scenario must
run race-free and hand out the CPU path's batches, on the devices it says."""


import pytest
import torch
from cudasim.scenes import expected, loader, read_on_consumer

BACKENDS = ["thread", "process"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_consumer_reads_each_batch(sim, backend):
    want = expected(backend)
    sums = []
    with loader(backend, device="cuda") as ld:
        assert ld.device == torch.device("cuda", 0)
        for x, y in ld:
            assert x.device == ld.device and y.device == ld.device
            sums.append(read_on_consumer(x, y))
    assert len(sums) == len(want)
    for (s, y), (wx, wy) in zip(sums, want):
        torch.testing.assert_close(s.cpu(), wx.double().sum(dim=(1, 2, 3)))
        assert torch.equal(y.cpu(), wy)


@pytest.mark.parametrize("backend", BACKENDS)
def test_consumer_drops_each_batch_at_once(sim, backend):
    with loader(backend, device="cuda", n=48) as ld:
        for _ in range(2):
            for x, y in ld:
                x.mul(2), y.add(1)  # read by one kernel each, then dropped: the blocks go back at once
                del x, y
    assert sim.allocator.reused > 0  # blocks were reused, so the test could see a wrong reuse


@pytest.mark.parametrize("backend", BACKENDS)
def test_consumer_breaks_early_and_starts_again(sim, backend):
    want = expected(backend, epoch=1)
    with loader(backend, device="cuda") as ld:
        for i, (x, y) in enumerate(ld):
            read_on_consumer(x, y)
            if i == 1:
                break
        got = [(x.cpu(), y.cpu()) for x, y in ld]
    assert [torch.equal(y, wy) for (_, y), (_, wy) in zip(got, want)] == [True] * len(want)


def test_ring_slots_are_reused_only_after_their_copies(sim):
    with loader("thread", device="cuda", n=64, prefetch_factor=1) as ld:
        for _ in range(2):
            for x, y in ld:
                read_on_consumer(x, y)
        ring = ld._source.ring
        assert ring is not None and len(ring) < len(ld)  # slots were reused


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_with_copies_in_flight_waits_for_them(sim, backend):
    ld = loader(backend, device="cuda")
    it = iter(ld)
    read_on_consumer(*next(it))
    stream = ld._driver._stream
    assert not sim.knows(stream)  # the next batches' copies are still queued
    ld.close()
    assert sim.knows(stream)


def test_several_gpus_in_one_process(sim):
    with loader(device="cuda:0") as a, loader(device="cuda:1") as b:
        for (xa, ya), (xb, yb) in zip(a, b):
            assert xa.device == torch.device("cuda", 0) and xb.device == torch.device("cuda", 1)
            read_on_consumer(xa, ya)
            with torch.cuda.device(1):
                read_on_consumer(xb, yb)
            assert torch.equal(xa.cpu(), xb.cpu())
    with pytest.raises(RuntimeError, match="same device"):
        xa + xb  # the simulator refuses what CUDA refuses


def test_a_copy_failing_mid_batch_keeps_its_buffer_until_the_queued_copy_ran(sim):
    """Defect 2: the labels' copy fails after the images' copy was queued; the ring slot
    must not be rewritten before that images copy has read it."""
    copies = []

    def labels_of_the_third_batch(src):
        copies.append(src.dtype)
        return src.dtype == torch.int64 and copies.count(torch.int64) == 3

    sim.fail_copy = labels_of_the_third_batch
    with loader("thread", device="cuda", n=64, prefetch_factor=1) as ld:
        with pytest.raises(torch.cuda.OutOfMemoryError, match="injected"):
            for x, y in ld:
                read_on_consumer(x, y)
        sim.fail_copy = None
        for x, y in ld:  # the next pass rewrites the ring's slots
            read_on_consumer(x, y)


def test_process_worker_slots_are_reused_and_copied_to_the_gpu_only_from_pinned_copies(sim):
    """The process backend frees a worker's slot once the pin-memory thread copied the batch
    out: the host-to-device copies read those pinned copies, never a slot (which would be a
    pageable, synchronizing copy of memory the worker rewrites)."""
    with loader("process", device="cuda", n=64) as ld:
        for _ in range(2):
            for x, y in ld:
                read_on_consumer(x, y)
        reused, new = ld._source.pool.table.counts
    assert reused > 0
    assert sum(sim.pageable_copies.values()) == 0 and ld.stats()["unpinned_batches"] == 0
