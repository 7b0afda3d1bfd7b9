"""Process workers reuse their batch buffers (fastload.sources.handoff): never at the
expense of a batch the consumer holds, and without losing slots to cut passes or errors."""

import os
import pickle
import threading

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.sources import handoff
from fastload.sources.handoff import BufferTable


class Pixels(torch.utils.data.Dataset):
    """Sample i is a 16×16 image of value i % 251; sample 5 fails while ``flag`` exists."""

    def __init__(self, n: int = 40, flag: str | None = None) -> None:
        self.n, self.flag = n, flag

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 5 and self.flag is not None and os.path.exists(self.flag):
            raise ValueError("sample 5 is broken today")
        return np.full((16, 16, 3), i % 251, np.uint8), i


def loader(ds, **kw):
    kw = {"batch_size": 4, "num_workers": 1, "prefetch_factor": 2, "normalize": False, "device": "cpu",
          "backend": "process", "multiprocessing_context": "fork", **kw}
    return fl.Loader(ds, **kw)


def slots(loader: fl.Loader) -> BufferTable:
    return loader._source.pool.table


def test_batches_the_consumer_holds_keep_their_pixels_while_slots_are_reused():
    with loader(Pixels(), shuffle=True, seed=1, return_index=True) as dl:
        kept = [(x, idx) for e in range(3) for x, _, idx in (dl.set_epoch(e) or dl)]
        reused, new = slots(dl).counts
    assert reused >= 20 and new == 0  # 30 batches in 4 slots
    for x, idx in kept:
        expected = (idx % 251).to(torch.uint8).view(-1, 1, 1, 1).expand_as(x)
        assert torch.equal(x, expected)


def test_passes_cut_short_give_their_slots_back():
    with loader(Pixels()) as dl:
        for _ in range(6):  # each break leaves batches in flight, dropped unread at the next pass
            for _ in dl:
                break
        assert sum(len(x) for x, _ in dl) == 40
        reused, new = slots(dl).counts
    assert new == 0 and reused > 0


def test_workers_started_each_pass_start_with_free_slots():
    with loader(Pixels(), persistent_workers=False) as dl:
        for _ in range(4):  # batches in flight die with their workers, unread
            for _ in dl:
                break
        assert sum(len(x) for x, _ in dl) == 40
        reused, new = slots(dl).counts
    assert new == 0 and reused > 0


def test_failed_batches_give_their_slots_back(tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    with loader(Pixels(flag=str(flag))) as dl:
        for _ in range(6):
            with pytest.raises(fl.SampleError, match="sample 5"):
                list(dl)
        flag.unlink()
        assert sum(len(x) for x, _ in dl) == 40
        reused, new = slots(dl).counts
    assert new == 0 and reused > 0


def test_a_worker_without_a_free_slot_takes_a_new_buffer():
    table = BufferTable(workers=1, per_worker=2)
    a, lease_a = table.buffer(0, (2, 4, 4, 3))
    b, lease_b = table.buffer(0, (2, 4, 4, 3))
    c, lease_c = table.buffer(0, (2, 4, 4, 3))
    assert lease_a is not None and lease_b is not None and lease_c is None
    assert a.data_ptr() != b.data_ptr() and table.counts == (0, 1)
    lease_a.release()  # made here, not received: only the receiving process frees a slot
    assert table.buffer(0, (2, 4, 4, 3))[1] is None
    table.free(0, lease_a.buffer, lease_a.owner)
    again, _ = table.buffer(0, (1, 4, 4, 3))
    assert again.data_ptr() == a.data_ptr() and again.shape == (1, 4, 4, 3) and table.counts == (1, 2)


def test_a_late_release_from_a_dead_worker_leaves_its_successors_slot_lent():
    table = BufferTable(workers=1, per_worker=1)
    _, lease = table.buffer(0, (1, 2, 2, 3))
    received = pickle.loads(pickle.dumps(lease))  # the main process's copy of the lease
    table.free(0, lease.buffer, lease.owner)  # the worker died; its successor lent the slot again:
    table._rows[0, lease.buffer] = lease.owner + 1
    received.release()  # the dead worker's batch is dropped only now
    assert table.buffer(0, (1, 2, 2, 3))[1] is None  # still lent: a new buffer, not the lent one
    table.free(0, lease.buffer, lease.owner + 1)
    assert table.buffer(0, (1, 2, 2, 3))[1] is not None


def _other_threads_cpu_s() -> float:
    """CPU seconds used so far by this process's threads other than the calling one."""
    me, total = str(threading.get_native_id()), 0
    for tid in os.listdir("/proc/self/task"):
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread CPU times from /proc (Linux)")
def test_a_batch_copied_out_of_its_buffer_is_copied_by_the_calling_thread_alone():
    # torch's copy wakes its intra-op (OpenMP) team, which then spins for CPU the workers
    # need: with decode="gpu" on 16 cores that was 1.1 ms of CPU per image (RESULTS.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        src = torch.ones(48 << 20, dtype=torch.uint8)

        def others_cpu(copy) -> float:
            before = _other_threads_cpu_s()
            for _ in range(30):
                copy(src)
            return _other_threads_cpu_s() - before

        ours = others_cpu(handoff.copied)  # first: the team's spinning after torch's copies is not ours
        by_torch = others_cpu(lambda t: torch.empty_like(t).copy_(t))
        if by_torch < 0.05:
            pytest.skip(f"torch's copy used no other thread here ({by_torch:.2f} s): nothing to compare")
        assert torch.equal(handoff.copied(src[:1000]), src[:1000])
    finally:
        torch.set_num_threads(threads)
    assert ours < 0.25 * by_torch, (ours, by_torch)


def test_the_main_process_copies_batches_out_of_buffers_with_that_copy(monkeypatch):
    calls = []

    def counted(t):
        calls.append(t.shape)
        return copied(t)

    copied = handoff.copied
    monkeypatch.setattr(handoff, "copied", counted)
    with loader(Pixels()) as dl:
        assert sum(len(x) for x, _ in dl) == 40
        reused, _ = slots(dl).counts
    assert reused > 0 and len(calls) >= reused
