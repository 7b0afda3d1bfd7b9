"""The simulator's own rules (tests/cudasim), each shown on a few lines of CUDA-style code."""

import pytest
import torch

from cudasim.scenes import read_on_consumer, loader


def test_a_read_on_another_stream_without_a_wait_is_a_race_naming_both_accesses(sim):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.ones(4, device="cuda")
    x.sum()  # default stream, no wait
    races = sim.take_races()
    assert len(races) == 1
    assert "read by sum on cuda:0/default" in races[0] and "write by torch.ones on cuda:0/stream" in races[0]
    assert "test_cuda_sim_model.py" in races[0]  # where each access was made


def test_an_event_wait_orders_the_streams(sim):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.ones(4, device="cuda")
    done = side.record_event()
    torch.cuda.current_stream().wait_event(done)
    assert x.sum().item() == 4.0


def test_work_completes_only_once_waited_on(sim):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.ones(4, device="cuda")
    event = side.record_event()
    assert not event.query() and not side.query()
    event.synchronize()
    assert event.query() and torch.cuda.Event().query()  # an event never recorded counts as done


def test_a_freed_block_is_reused_on_its_stream_unless_record_stream_holds_it(sim):
    side = torch.cuda.Stream()
    x = torch.ones(256, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.sum()
    del x
    y = torch.zeros(256, device="cuda")  # the same block, rewritten: side's read may not have run
    assert sim.allocator.reused == 1 and "write by torch.zeros" in sim.races[0] and "read by sum" in sim.races[0]
    sim.races.clear()
    z = torch.ones(256, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        z.sum()
    z.record_stream(side)
    held, free = z._sim_block.memory, y._sim_block.memory
    del z, y
    w = torch.zeros(256, device="cuda")  # z's block is held until side's read is known done
    assert w._sim_block.memory is free
    assert torch.zeros(256, device="cuda")._sim_block.memory is not held


def test_a_pinned_buffer_rewritten_under_its_copy_is_a_race(sim):
    host = torch.arange(8).pin_memory()
    host.to("cuda", non_blocking=True)
    host += 1
    assert "RACE on pinned host memory" in sim.take_races()[0]
    done = torch.cuda.Event()
    host.to("cuda", non_blocking=True)
    done.record()
    done.synchronize()
    host += 1  # after the copy: fine


def test_a_pageable_copy_synchronizes_and_is_counted(sim):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.ones(4, device="cuda")
        before = side.record_event()
        torch.arange(4).to("cuda", non_blocking=True)
    assert sim.pageable_copies[side.agent] == 1
    assert before.query() and not side.query()  # the host waited for the stream's earlier work


def test_what_cuda_refuses_raises(sim):
    x = torch.ones(2, device="cuda:0")
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(2, device="cuda:1")
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(2)
    with pytest.raises(TypeError, match="numpy"):
        x.numpy()
    assert (x + torch.tensor(1.0)).device == x.device  # a CPU scalar is fine


@pytest.mark.sim(seed=0)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_loader_is_race_free_when_work_completes_in_random_orders(sim, seed):
    """Under a seed, query() and the allocator's event checks say "done" at random."""
    sim.rng.seed(seed)
    with loader("thread", device="cuda", n=48, prefetch_factor=1) as ld:
        for _ in range(2):
            for x, y in ld:
                read_on_consumer(x, y)
    assert sim.rng is not None



GPU_TESTS = ["test_cuda_numerics_match_cpu", "test_cuda_consumer_waits_for_each_batch",
             "test_cuda_freed_outputs_are_not_reused_while_the_consumer_reads",
             "test_cuda_reused_host_buffer_waits_for_its_copy",
             "test_cuda_unpinned_batches_are_counted_and_errors_propagate",
             "test_cuda_a_failing_normalizer_releases_the_buffer_with_its_copy_event"]


@pytest.mark.parametrize("name", GPU_TESTS)
def test_the_gpu_tests_of_the_prefetcher_pass_on_the_simulator(sim, name):
    """The tests marked cuda in test_prefetch.py (run by make gpu-check on a GPU), here (but
    the 50-epoch memory one: 10 s in the simulator; the allocator model is shown above)."""
    import test_prefetch

    getattr(test_prefetch, name)()
