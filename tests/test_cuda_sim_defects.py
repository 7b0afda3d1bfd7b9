"""The defects of issue 26, each shown on simulated GPUs (tests/cudasim) or on the CPU."""

import numpy as np
import pytest
import torch
from cudasim.scenes import loader, read_on_consumer

import fastload as fl
from fastload.collate import fast_collate
from fastload.config import resolve_device
from fastload.device.prefetch import CudaPrefetcher


def _device_batches(n=6):
    """A user's iterable whose batches are made on the GPU by kernels on its own stream, and
    handed over ready on the current stream (PyTorch's convention)."""
    producer = torch.cuda.Stream()
    for i in range(n):
        with torch.cuda.stream(producer):
            x = torch.randint(0, 256, (4, 12, 10, 3), dtype=torch.uint8, device="cuda")
            y = torch.arange(4, device="cuda") + i
        torch.cuda.current_stream().wait_stream(producer)
        yield x, y  # dropped at the next one: its block goes back to the producer's stream


def test_3_inputs_already_on_the_device_are_waited_for_and_kept(sim):
    out = [read_on_consumer(x, y) for x, y in CudaPrefetcher(_device_batches(), device="cuda")]
    assert len(out) == 6


def test_4_pageable_labels_do_not_synchronize_their_copy(sim):
    rng = np.random.default_rng(0)
    samples = [[(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8), j) for j in range(4)] for _ in range(5)]
    user = [(fast_collate(s)[0], torch.from_numpy(np.arange(4))) for s in samples]  # pinned images, pageable labels
    prefetcher = CudaPrefetcher(user, device="cuda")
    for x, y in prefetcher:
        read_on_consumer(x, y)
    assert prefetcher.stats.unpinned == 0
    assert sum(sim.pageable_copies.values()) == 0, sim.pageable_copies


def test_4_fast_collate_pins_its_labels_with_its_images(sim):
    images, labels = fast_collate([(np.zeros((4, 4, 3), np.uint8), 3)] * 2, pin=True)
    assert images.is_pinned() and labels.is_pinned() and labels.tolist() == [3, 3]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_1_the_loader_of_a_ddp_rank_uses_its_local_gpu(sim, monkeypatch, backend):
    """LOCAL_RANK=1, the Loader built before set_device: current_device() still says 0."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert torch.cuda.current_device() == 0
    with loader(backend, device=None) as ld:
        assert ld.device == torch.device("cuda", 1)
        for x, y in ld:
            assert x.device == y.device == torch.device("cuda", 1)
            with torch.cuda.device(1):
                read_on_consumer(x, y)
    assert sim.contexts == {1}  # nothing ran or was pinned on GPU 0: no context there
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)  # an index given is kept


def test_1_an_unindexed_device_follows_set_device_at_each_pass(sim):
    with loader("process", device="cuda") as ld:
        assert ld.device == torch.device("cuda", 0)
        torch.cuda.set_device(1)  # e.g. Lightning, after the user built the loader
        try:
            devices = {x.device for x, _ in ld}
        finally:
            torch.cuda.set_device(0)
        assert devices == {torch.device("cuda", 1)} and ld.device == torch.device("cuda", 1)
        assert sim.contexts == {1}  # the first pass's buffers were pinned for GPU 1 too
    with loader(device="cuda:0") as pinned_to_0:
        torch.cuda.set_device(1)
        try:
            assert {x.device for x, _ in pinned_to_0} == {torch.device("cuda", 0)}
        finally:
            torch.cuda.set_device(0)


class _Event:
    """A copy's event that completes only when waited on; the waits are logged."""

    def __init__(self, name, waits):
        self.name, self.waits, self.done = name, waits, False

    def query(self):
        return self.done

    def synchronize(self):
        self.waits.append(self.name)
        self.done = True


def test_5_the_ring_waits_on_the_oldest_pending_copy():
    from fastload.sources.ring import BufferRing

    ring = BufferRing(3, (2, 2, 2, 3), pin=False)
    assert [ring.acquire(None) for _ in range(3)] == [0, 1, 2]
    waits = []
    for slot in (1, 0, 2):  # slot 1's copy was queued first
        ring.release(slot, _Event(f"copy of slot {slot}", waits))
    assert ring.acquire(None) == 1
    assert waits == ["copy of slot 1"]


def test_6_the_tuner_takes_cudnn_and_cublas_allocation_failures_as_out_of_memory(sim, monkeypatch):
    import gc

    from fastload.tune.model import try_batch

    order = []
    monkeypatch.setattr(gc, "collect", lambda *a: order.append("gc.collect") or 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty_cache"))
    for message in ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                    "`cublasCreate(handle)`"):
        def step(bs, message=message):
            raise RuntimeError(message)

        assert try_batch(step, 8, lambda: order.append("release"), torch.device("cuda", 0)) is False
    assert order == ["release", "gc.collect", "empty_cache"] * 2  # cycles freed before the cache is emptied

    def broken(bs):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        try_batch(broken, 8, lambda: None, torch.device("cuda", 0))


def test_6_the_largest_batch_leaves_room_for_what_the_loader_keeps_on_the_gpu(sim):
    from fastload.tune.model import largest_batch, loader_device_bytes, try_batch

    per_sample, size = 3 * 32 * 32 * 4 * 6, 32  # the step's activations, in bytes per sample
    sim.allocator.capacity = 2000 * per_sample
    device = torch.device("cuda", 0)

    def step(bs):
        torch.empty(bs * per_sample, dtype=torch.uint8, device=device)

    def fits(bs):
        return try_batch(step, bs, lambda: None, device, loader_device_bytes(bs, size))

    best = largest_batch(fits, 8)
    assert best > 0 and best * per_sample + loader_device_bytes(best, size) <= sim.allocator.capacity
    assert largest_batch(lambda bs: try_batch(step, bs, lambda: None, device), 8) > best  # without the reserve


def test_1_without_workers_a_batch_is_pinned_for_the_loaders_gpu_only(sim, monkeypatch):
    """num_workers=0 makes batches in this process: pinned for the rank's GPU (not in GPU 0's
    context, where current_device() still points), and not at all for a CPU loader or with
    pin_memory=False (they were pinned whenever CUDA was available)."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    with loader("process", device=None, num_workers=0) as ld:
        for x, y in ld:
            with torch.cuda.device(1):
                read_on_consumer(x, y)
        assert ld.stats()["unpinned_batches"] == 0
    assert sim.contexts == {1}
    monkeypatch.delenv("LOCAL_RANK")
    sim.contexts.clear()
    with loader("process", device="cpu", num_workers=0) as ld:
        assert len(list(ld)) == len(ld)
    assert sim.contexts == set(), "a CPU loader pinned its batches: a CUDA context on a GPU it never uses"
    with pytest.warns(RuntimeWarning, match="unpinned"):
        with loader("process", device="cuda:1", num_workers=0, pin_memory=False) as ld:
            with torch.cuda.device(1):
                for x, y in ld:
                    read_on_consumer(x, y)
            assert ld.stats()["unpinned_batches"] == len(ld)


@pytest.mark.needs("tfrecord")
def test_1_a_stream_without_workers_is_pinned_only_for_a_gpu(sim, tmp_path):
    from tfrecord_files import write_records

    path = str(tmp_path / "one.tfrecord")
    write_records(path, range(8))
    with fl.Loader(fl.TFRecordStream(path), batch_size=4, num_workers=0, device="cpu") as ld:
        assert len(list(ld)) == 2
    assert sim.contexts == set()
    with fl.Loader(fl.TFRecordStream(path), batch_size=4, num_workers=0, device="cuda:1") as ld:
        with torch.cuda.device(1):
            for x, y in ld:
                read_on_consumer(x, y)
        assert ld.stats()["unpinned_batches"] == 0
    assert sim.contexts == {1}
