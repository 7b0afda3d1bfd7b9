import threading
import time
import traceback

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.sources import ring as ring_module
from fastload.sources.ring import BufferRing


def _run(ds, backend, **kw):
    opts = dict(batch_size=5, num_workers=2, shuffle=True, seed=11, device="cpu", backend=backend)
    opts.update(kw)
    with fl.Loader(ds, **opts) as loader:
        out = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            for x, y in loader:
                out.append((x.clone(), y.clone()))
        return out


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("world_size", [1, 2])
def test_byte_identical_to_process_backend(folder, normalize, world_size):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(20))
    for rank in range(world_size):
        kw = dict(normalize=normalize, shard=fl.Shard(rank=rank, world_size=world_size))
        a, b = _run(ds, "process", **kw), _run(ds, "thread", **kw)
        assert len(a) == len(b) > 0
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_reused_buffers_survive_a_slow_consumer(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.eval(16, resize=18))
    loader = fl.Loader(ds, batch_size=3, num_workers=2, shuffle=True, seed=11, device="cpu", backend="thread",
                       prefetch_factor=1)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        got = []
        for x, y in loader:
            time.sleep(0.02)  # threads run ahead and must wait for a free buffer
            got.append((x.clone(), y.clone()))
    ring = loader._source.ring
    assert len(ring) < len(got), "buffers must be reused, not one per batch"
    loader.close()
    ref = fl.Loader(ds, batch_size=3, num_workers=0, shuffle=True, seed=11, device="cpu")
    ref.set_epoch(1)
    for (xa, ya), (xb, yb) in zip(ref, got):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_slots_are_written_in_place(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(16))
    loader = fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", backend="thread")
    for _ in range(2):
        list(loader)
    # Only the head of each pass, the two samples that agree on the shape, is copied.
    assert loader._source.copies == 4
    loader.close()


def _exploding(img, rng):
    raise ZeroDivisionError("transform blew up")


def test_transform_error_reaches_the_loop_with_its_traceback_and_sample(folder):
    ds = fl.ImageFolder(folder, transform=[fl.transforms.RandomResizedCrop(8), _exploding])
    with fl.Loader(ds, batch_size=4, num_workers=2, device="cpu", backend="thread") as loader:
        with pytest.raises(fl.SampleError, match=r"sample 0 \(.*c0/000\.jpg\): ZeroDivisionError: .*blew up") as info:
            list(loader)
    cause = info.value.__cause__
    assert isinstance(cause, ZeroDivisionError)
    assert "_exploding" in "".join(traceback.format_tb(cause.__traceback__))


def test_no_thread_left_after_close(folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(16))
    before = set(threading.enumerate())  # earlier tests may leave daemon threads stuck in a sample
    loader = fl.Loader(ds, batch_size=4, num_workers=3, device="cpu", backend="thread", stall_warning=0.5)
    next(iter(loader))  # abandoned mid-epoch
    assert len(set(threading.enumerate()) - before) >= 3
    loader.close()
    loader.close()
    alive = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("fastload")]
    assert alive == []


class _Event:
    """A CUDA event stand-in: done once ``fire`` is called; synchronize() blocks until then."""

    def __init__(self):
        self._done = threading.Event()
        self.synchronized = 0

    def query(self):
        return self._done.is_set()

    def synchronize(self):
        self.synchronized += 1
        self._done.wait()

    def fire(self):
        self._done.set()


class _Writers:
    def __init__(self, done=True):
        self.done = done

    def finished(self):
        return self.done


def test_ring_waits_for_the_copy_event_without_polling():
    ring = BufferRing(1, (2, 4, 4, 3), pin=False)
    slot = ring.acquire(_Writers())
    event = _Event()
    ring.release(slot, event)  # copy enqueued but not finished
    got = []
    waiter = threading.Thread(target=lambda: got.append(ring.acquire(_Writers())))
    waiter.start()
    time.sleep(0.2)
    assert got == [], "buffer reused while its copy was in flight"
    assert event.synchronized == 1, "the ring should block on the event, not poll it"
    event.fire()
    waiter.join(2)
    assert got == [0]


def test_ring_waits_for_writers_of_a_released_slot():
    ring = BufferRing(1, (2, 4, 4, 3), pin=False)
    writers = _Writers(done=False)
    slot = ring.acquire(writers)
    ring.release(slot)  # the consumer gave it back (an abandoned pass) but tasks still write
    got = []
    waiter = threading.Thread(target=lambda: got.append(ring.acquire(_Writers())))
    waiter.start()
    time.sleep(0.2)
    assert got == [], "buffer reused while decode tasks still wrote into it"
    writers.done = True
    ring.wake()
    waiter.join(2)
    assert got == [0]


def test_thread_backend_needs_threads(folder):
    with pytest.raises(ValueError, match="num_workers >= 1"):
        fl.Loader(fl.ImageFolder(folder), num_workers=0, backend="thread", device="cpu")


def test_ctrl_c_exits_promptly(folder):
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import faulthandler, signal\n"
        "faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it hangs, if it does\n"
        # What a terminal gives: a job started with `&` by a script inherits SIGINT ignored.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import fastload as fl\n"
        f"ds = fl.ImageFolder({folder!r}, transform=fl.transforms.train(64))\n"
        "loader = fl.Loader(ds, batch_size=4, num_workers=2, device='cpu', backend='thread')\n"
        "for _ in range(2):  # Ctrl-C in the steady state, after first-use imports and region decodes\n"
        "    for _ in loader:\n"
        "        pass\n"
        "print('started', flush=True)\n"
        "while True:\n"
        "    for _ in loader:\n"
        "        pass\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3.0)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"Ctrl-C did not stop the loop; its threads:\n{err}")
    assert time.monotonic() - start < 5, "took too long to stop"
    assert proc.returncode != 0 and "KeyboardInterrupt" in err


class _Tiny(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((8, 8, 3), i % 256, np.uint8), i


def test_a_huge_prefetch_factor_holds_no_more_than_a_pass(monkeypatch):
    # Issue 40 (trust round 5): prefetch_factor=10**6 allocated the whole ring up front
    # (12.9 GB, 33 s); 10**9 never delivered. A pass of 10 batches needs 10 ahead at most.
    with fl.Loader(_Tiny(40), batch_size=4, num_workers=2, backend="thread", prefetch_factor=10**5,
                   device="cpu", seed=0) as loader:
        assert [y.tolist() for _, y in loader] == [list(range(i, i + 4)) for i in range(0, 40, 4)]
        assert len(loader._source.ring) <= 10 + 3
    # Where even a pass's batches cannot fit, the option is named before anything is allocated.
    monkeypatch.setattr(ring_module, "available_memory", lambda: 2**16)
    with fl.Loader(_Tiny(4000), batch_size=4, num_workers=2, backend="thread", prefetch_factor=10**6,
                   device="cpu") as loader:
        with pytest.raises(ValueError, match=r"prefetch_factor: the thread backend would hold 1003 batches"):
            next(iter(loader))


class _HangsAt(torch.utils.data.Dataset):
    """Sample ``at`` hangs until ``release`` is set (a stalled network file)."""

    def __init__(self, at, release):
        self.at, self.release = at, release

    def __len__(self):
        return 48

    def __getitem__(self, i):
        if i == self.at:
            self.release.wait(30)
        return np.full((8, 8, 3), i, np.uint8), i


@pytest.mark.parametrize("kind", ["indexed", pytest.param("stream", marks=pytest.mark.slow)])  # stream: 11 s
def test_after_a_timeout_the_next_pass_gets_new_threads(tmp_path, kind):
    # A fault injector: a thread stuck in a sample was never replaced. Each timed-out pass left
    # one more stuck; once every decode thread was (indexed), or the stuck slot threads held
    # every ring buffer (a stream), every later pass delivered nothing. The process backend
    # starts new workers; the threads now start anew too, and each pass gets what comes before
    # the stuck sample.
    release = threading.Event()
    if kind == "stream":
        from tfrecord_files import tiny_jpeg, write_records

        from fastload.decode import decode_image

        path = str(tmp_path / "one.tfrecord")
        write_records(path, range(48))
        stuck = int(decode_image(tiny_jpeg(10)).sum())

        def hang(img, rng):
            if int(img.sum()) == stuck:
                release.wait(30)
            return img

        data = fl.TFRecordStream(path, transform=hang)
    else:
        data = _HangsAt(20, release)
    try:
        with fl.Loader(data, batch_size=4, num_workers=2, backend="thread", device="cpu", timeout=1,
                       prefetch_factor=1) as loader:
            got = []
            # More passes than threads, and than a stream's ring has buffers (7 here: each stuck
            # slot thread keeps one).
            for _ in range(4 if kind == "indexed" else 9):
                n = 0
                with pytest.raises(fl.WorkerFailure, match="timed out after 1 s"):
                    for _, y in loader:
                        n += len(y)
                got.append(n)
            assert got[0] > 0 and got == [got[0]] * len(got), got
    finally:
        release.set()


def test_a_replaced_thread_ending_its_stuck_sample_leaves_its_replacements_row_alone():
    # A reviewer: after a timeout replaced the threads, the old thread finishing its stuck
    # sample 20 cleared in-flight row 0, which the new thread 0 had set for sample 8: the next
    # timeout said "no sample was in flight".
    class Hangs(torch.utils.data.Dataset):
        hang = {20: 1.8}

        def __len__(self):
            return 48

        def __getitem__(self, i):
            time.sleep(self.hang.get(i, 0))
            return np.full((8, 8, 3), i, np.uint8), i

    ds = Hangs()
    with fl.Loader(ds, batch_size=4, num_workers=1, backend="thread", device="cpu", timeout=1,
                   prefetch_factor=1) as loader:
        with pytest.raises(fl.WorkerFailure, match=r"loading sample 20 "):
            list(loader)
        ds.hang = {8: 3.0}
        with pytest.raises(fl.WorkerFailure, match=r"loading sample 8 "):
            list(loader)
