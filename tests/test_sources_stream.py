"""A TFRecordStream through the Loader: equal batch counts per rank, each record once, on_error."""

import gzip
import warnings

import pytest
import torch

import fastload as fl

from tfrecord_files import write_records, write_shards

pytestmark = pytest.mark.needs("tfrecord")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _stream_files(tmp_path, sizes, gz):
    return write_shards(tmp_path / "data", sizes, gz) + "/part-*"


@pytest.mark.filterwarnings("ignore:.*GZIP file.*split between:RuntimeWarning")
@pytest.mark.parametrize("gz", [False, True])
def test_ranks_get_equal_batch_counts_and_every_record_once(tmp_path, gz):
    """25 records, batch 3, 4 ranks: DDP hangs unless every rank yields as many batches."""
    pattern = _stream_files(tmp_path, [7, 6, 6, 6], gz)
    stream = fl.TFRecordStream(pattern, transform=fl.transforms.eval(8, resize=8))
    counts, seen = [], []
    for rank in range(4):
        with fl.Loader(stream, batch_size=3, num_workers=2, shard=fl.Shard(rank=rank, world_size=4), device="cpu",
                       normalize=False) as loader:
            batches = [y.tolist() for _, y in loader]
            assert len(batches) == len(loader)
            counts.append(len(batches))
            seen += [label for b in batches for label in b]
    assert len(set(counts)) == 1, counts
    assert set(seen) == set(range(25)), "a record was never read"


@pytest.mark.filterwarnings("ignore:.*GZIP file.*split between:RuntimeWarning")
def test_corrupt_record_is_skipped_and_named_and_counts_stay_equal(tmp_path):
    path = str(tmp_path / "one.tfrecord")
    offsets = write_records(path, range(40))
    raw = bytearray(open(path, "rb").read())
    raw[offsets[17] + 40] ^= 0xFF  # inside record 17's data: its CRC fails
    with gzip.open(path + ".gz", "wb") as f:
        f.write(bytes(raw))
    stream = fl.TFRecordStream(path + ".gz", transform=fl.transforms.eval(8, resize=8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fl.Loader(stream, batch_size=4, num_workers=2, device="cpu", on_error="skip") as loader:
            labels = [label for _, y in loader for label in y.tolist()]
            skipped = loader.skipped
    assert len(labels) == 40 and 17 not in labels
    assert [s.index for s in skipped] == [17] and "CRC" in skipped[0].error and "byte" in skipped[0].where
    with fl.Loader(stream, batch_size=4, num_workers=2, device="cpu") as loader:
        with pytest.raises(Exception, match="CRC"):
            list(loader)


def test_stream_passes_are_epochs(tmp_path):
    pattern = _stream_files(tmp_path, [5, 5], False)
    stream = fl.TFRecordStream(pattern, transform=fl.transforms.train(8))
    with fl.Loader(stream, batch_size=5, num_workers=0, device="cpu", normalize=False) as loader:
        a = [x.clone() for x, _ in loader]
        b = [x.clone() for x, _ in loader]
    assert len(a) == len(b) == 2
    assert any(not (x == y).all() for x, y in zip(a, b)), "augmentation repeated across passes"


class _OddRecord:
    """Leaves every image as it is but the one whose pixels sum to ``odd``: that one comes out short."""

    def __init__(self, odd):
        self.odd = odd

    def __call__(self, img, rng):
        return img[:5] if int(img.sum()) == self.odd else img


@pytest.mark.parametrize("odd", [17, 0])  # inside a batch, and the first record of the first batch
def test_a_record_of_the_wrong_shape_is_its_own_error(tmp_path, odd):
    # As for an indexed dataset (test_loader_faults): the record's error, under the policy,
    # named with its file; it was a bare ValueError from the collate, raised under "skip" too.
    from tfrecord_files import tiny_jpeg

    from fastload.decode import decode_image

    path = str(tmp_path / "one.tfrecord")
    write_records(path, range(40))
    stream = fl.TFRecordStream(path, transform=_OddRecord(int(decode_image(tiny_jpeg(odd)).sum())))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fl.Loader(stream, batch_size=4, num_workers=2, device="cpu", on_error="skip") as loader:
            labels = [label for _, y in loader for label in y.tolist()]
            skipped = loader.skipped
    assert len(labels) == 40 and odd not in labels
    assert [s.index for s in skipped] == [odd] and "shape (5, 8, 3)" in skipped[0].error
    assert "one.tfrecord" in skipped[0].where
    with fl.Loader(stream, batch_size=4, num_workers=2, device="cpu") as loader:
        with pytest.raises(fl.SampleError, match=rf"record {odd} \(.*one\.tfrecord.*shape \(5, 8, 3\)"):
            list(loader)


def test_a_streams_records_are_what_its_source_reads_them_as(tmp_path):
    # RecordSamples types its records as StreamRecordLike (number, where, label, error); the
    # records flow as Any from records_for, so only this checks that a stream's are such.
    from fastload.datasets.protocols import StreamRecordLike

    path = str(tmp_path / "one.tfrecord")
    write_records(path, range(3))
    records = list(fl.TFRecordStream(path).records_for(0, 1))
    assert records and all(isinstance(r, StreamRecordLike) for r in records)
    assert [(r.number, r.label, r.error) for r in records] == [(0, 0, None), (1, 1, None), (2, 2, None)]


@pytest.mark.parametrize("workers", [0, 2])
def test_failed_records_become_their_slots_neighbours_in_place(tmp_path, workers):
    # Issue 37: the builder finishes a stream's rows in place; a record failed under "skip" takes
    # the pixels and target of its slot's last good record, else (the slot's first records) of the
    # first good one after it, even when a whole batch failed before the slot had a good record.
    path = str(tmp_path / "one.tfrecord")
    offsets = write_records(path, range(24))
    raw = bytearray(open(path, "rb").read())
    bad = [0, 1, 2, 3, 4, 5, 17, 19]
    for k in bad:
        raw[offsets[k] + 40] ^= 0xFF  # inside record k's data: its CRC fails
    open(path, "wb").write(bytes(raw))
    stream = fl.TFRecordStream(path, transform=fl.transforms.eval(8, resize=8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fl.Loader(stream, batch_size=4, num_workers=workers, device="cpu", normalize=False,
                       on_error="skip", return_index=True) as loader:
            batches = [(x.clone(), y.clone(), i.clone()) for x, y, i in loader]
            skipped = loader.skipped
    x = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches]).tolist()
    indices = torch.cat([b[2] for b in batches]).tolist()
    # One slot per worker: the records a slot reads, in order, with each failure its neighbour.
    slots = [list(range(24))] if workers == 0 else [list(range(12)), list(range(12, 24))]
    want = {}
    for slot in slots:
        good = [k for k in slot if k not in bad]
        for k in slot:
            left = [g for g in good if g < k]
            want[k] = k if k in good else (left[-1] if left else good[0])
    assert len(labels) == 24 and sorted(s.index for s in skipped) == bad
    assert labels == indices  # each row's target is its (neighbour) record's
    # Worker w's slot gives batches w, w + workers, ...: each slot's rows in its reading order.
    per_slot = [[k for b in batches[w :: max(1, workers)] for k in b[2].tolist()] for w in range(len(slots))]
    assert per_slot == [[want[k] for k in slot] for slot in slots]
    for row, index in enumerate(indices):  # a neighbour's row holds its pixels
        assert torch.equal(x[row], x[indices.index(index)])


@pytest.mark.parametrize("workers", [1, 3])
def test_a_stream_on_the_thread_backend_gives_the_process_backends_batches(tmp_path, workers):
    # Issue 37: a stream runs on every backend; threads read the same slots as worker processes,
    # so the batches (pixels, targets, order) and a resumed pass are the same.
    pattern = _stream_files(tmp_path, [9, 7, 8], False)
    stream = fl.TFRecordStream(pattern, transform=fl.transforms.train(16))

    def run(backend, state=None):
        with fl.Loader(stream, batch_size=4, num_workers=workers, backend=backend, device="cpu", normalize=False,
                       return_index=True, seed=3) as loader:
            if state is not None:
                loader.load_state_dict(state)
                return [(x.clone(), i.clone()) for x, _, i in loader], None
            it = iter(loader)
            got = [tuple(t.clone() for t in next(it))[::2] for _ in range(2)]
            middle = loader.state_dict()
            got += [(x.clone(), i.clone()) for x, _, i in it]
            return got, middle

    threads, middle = run("thread")
    processes, _ = run("process")
    assert [i.tolist() for _, i in threads] == [i.tolist() for _, i in processes]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(threads, processes, strict=True))
    resumed, _ = run("thread", middle)
    assert [i.tolist() for _, i in resumed] == [i.tolist() for _, i in threads[2:]]


def _threads(head):
    """``head``, then every thread's stack: where a consumer that did not end is waiting."""
    import sys
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = [f"--- {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame))}"
              for ident, frame in sys._current_frames().items()]
    return "\n".join([head, *stacks])


class _Hangs:
    """Leaves every image as it is but record ``at``'s (by its pixel sum), on which it hangs
    (``entered`` set as it starts to)."""

    def __init__(self, at, release):
        import threading

        self.at, self.release, self.entered, self.sums, self.waits = at, release, threading.Event(), [], []

    def __call__(self, img, rng):
        import time

        self.sums.append(int(img.sum()))
        if int(img.sum()) == self.at:
            self.entered.set()
            began = time.monotonic()
            released = self.release.wait(30)
            self.waits.append((released, round(time.monotonic() - began, 3), threading_name()))
        return img


def threading_name():
    import threading

    return threading.current_thread().name


def test_a_stream_on_threads_ends_at_its_timeout_and_at_close(tmp_path):
    # A slot stuck in a record: the consumer's wait ends at the Loader's timeout, naming the
    # record in flight, and close() from another thread ends a pass blocked on it at once.
    # Record 11, the fourth of slot 1's first batch, past the samples its shape is learnt from
    # (8 and 9; a hang there is the next test's).
    import threading
    import time

    from tfrecord_files import tiny_jpeg

    from fastload.decode import decode_image

    path = str(tmp_path / "one.tfrecord")
    write_records(path, range(16))
    release = threading.Event()
    stream = fl.TFRecordStream(path, transform=_Hangs(int(decode_image(tiny_jpeg(11)).sum()), release))
    try:
        with fl.Loader(stream, batch_size=4, num_workers=2, backend="thread", device="cpu", timeout=1) as loader:
            start = time.monotonic()
            with pytest.raises(fl.WorkerFailure, match=r"timed out after 1 s.*record 11 \("):
                list(loader)
            assert time.monotonic() - start < 5
        hangs = _Hangs(int(decode_image(tiny_jpeg(11)).sum()), release)  # a stream of its own: its own `entered`
        loader = fl.Loader(fl.TFRecordStream(path, transform=hangs), batch_size=4, num_workers=2, backend="thread",
                           device="cpu", return_index=True)
        it = iter(loader)
        first = next(it)[2].tolist()  # slot 0's first batch; slot 1's holds record 11
        got = []

        def consume():
            try:
                got.append(f"returned {next(it)[2].tolist()}")  # a failure, said below
            except BaseException as e:
                got.append(e)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        assert hangs.entered.wait(30), _threads(f"record 11 never reached: first batch {first}, sums {hangs.sums}")
        time.sleep(0.1)  # the consumer waits for slot 1's batch
        start = time.monotonic()
        loader.close()
        consumer.join(5)
        took = time.monotonic() - start
        assert got and "close()" in str(got[0]) and took < 3, _threads(
            f"after {took:.1f} s, got {got!r}; first batch {first}; sums {hangs.sums}; "
            f"record 11's waits (released, seconds, thread) {hangs.waits}"
        )
    finally:
        release.set()


class _HangsAfter(_Hangs):
    """As :class:`_Hangs`; record ``after`` (by its pixel sum) waits up to 15 s for ``at`` to hang first."""

    def __init__(self, at, after, release):
        super().__init__(at, release)
        self.after = after

    def __call__(self, img, rng):
        if int(img.sum()) == self.after:
            self.entered.wait(15)
        return super().__call__(img, rng)


def test_a_sample_hanging_in_one_slots_first_batch_holds_up_no_other_slot(tmp_path):
    # The threads learn a pass's sample shape from each batch's first samples. They learnt it
    # under one lock, so a record hanging among slot 1's first ones (record 9, second of
    # [8, 9, 10, 11]) held slot 0's first batch until it returned. Slot 0's record 0 waits
    # here until record 9 hangs: slot 1 learns first, and the consumer's first batch must come
    # while record 9 still hangs (before: only after record 0's 15 s wait or the release).
    import threading
    import time

    from tfrecord_files import tiny_jpeg

    from fastload.decode import decode_image

    path = str(tmp_path / "one.tfrecord")
    write_records(path, range(16))
    release = threading.Event()
    sums = [int(decode_image(tiny_jpeg(k)).sum()) for k in (9, 0)]
    hangs = _HangsAfter(*sums, release)
    try:
        with fl.Loader(fl.TFRecordStream(path, transform=hangs), batch_size=4, num_workers=2, backend="thread",
                       device="cpu", return_index=True) as loader:
            start = time.monotonic()
            first = next(iter(loader))[2].tolist()
            took = time.monotonic() - start
            assert hangs.entered.is_set() and not hangs.waits, "record 9 never hung"
            assert first == [0, 1, 2, 3] and took < 8, f"slot 0's first batch {first} after {took:.1f} s"
            release.set()
    finally:
        release.set()


def test_a_stream_on_threads_reuses_a_ring_of_buffers(tmp_path):
    # Issue 37: a stream gets the indexed path's memory handling on threads too: its rows are
    # finished in place in a ring of reused buffers (not a new buffer per batch), and the
    # normalized batches are the process backend's.
    pattern = _stream_files(tmp_path, [9, 7, 8, 9, 7], False)
    stream = fl.TFRecordStream(pattern, transform=fl.transforms.train(16))
    got = {}
    for backend in ("thread", "process"):
        with fl.Loader(stream, batch_size=2, num_workers=2, backend=backend, device="cpu", seed=3) as loader:
            got[backend] = [[x.clone() for x, _ in loader] for _ in range(2)]
            if backend == "thread":
                ring = loader._source.maker.pool.ring
                assert ring is not None and len(ring) == 2 * (2 + 1) + 2 + 1  # not one per batch of the pass
    # prefetch_factor beyond what a pass can use allocates no more (issue 40, item 7)
    with fl.Loader(stream, batch_size=2, num_workers=2, backend="thread", device="cpu", seed=3,
                   prefetch_factor=10**6) as loader:
        assert [x.clone() for x, _ in loader][0].shape[0] == 2
        assert len(loader._source.maker.pool.ring) == min(2 * (10**6 + 1), len(loader) + 2) + 2 + 1
    assert len(got["thread"][0]) == 20
    for a, b in zip(got["thread"], got["process"], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", ["stream", "indexed"])
def test_a_pass_broken_off_on_threads_never_lends_its_buffers_to_the_next_while_written(tmp_path, kind):
    # A review found a new pass's batch with another sample's pixels: the pass before, broken off
    # after one batch, still wrote into (or gave back) ring buffers the new pass had been lent.
    # Every row of every pass must hold its own sample's pixels.
    pattern = _stream_files(tmp_path, [13, 11, 12], False)
    if kind == "stream":
        ds = fl.TFRecordStream(pattern, transform=fl.transforms.eval(16, resize=16))
    else:
        ds = fl.TFRecordDataset(pattern, transform=fl.transforms.eval(16, resize=16))
    opts = dict(batch_size=3, device="cpu", return_index=True, seed=1)
    with fl.Loader(ds, num_workers=0, **opts) as loader:
        want = {int(i): x[k].clone() for x, _, idx in loader for k, i in enumerate(idx)}
    with fl.Loader(ds, num_workers=2, backend="thread", prefetch_factor=3, **opts) as loader:
        for _ in range(30):
            for _ in loader:
                break  # a pass broken off with batches being made ahead
            for x, _, idx in loader:
                for k, i in enumerate(idx.tolist()):
                    assert torch.equal(x[k], want[i]), f"row {k} holds another sample's pixels than {i}'s"


class _SlowCalls:
    """Leaves every image as it is, 0.2 s each, noting when each call starts."""

    def __init__(self):
        self.starts = []

    def __call__(self, img, rng):
        import time

        self.starts.append(time.monotonic())
        time.sleep(0.2)
        return img


def test_close_of_a_stream_on_threads_waits_for_its_slot_threads(tmp_path):
    # A fault injector: close() of a stream pass on threads returned at once while its slot
    # threads went on making their batches, calling the user's transform up to 1.5 s later, and
    # a program that left its loop with `break` and exited aborted (SIGABRT) in 5 of 12 runs.
    import threading
    import time

    path = str(tmp_path / "one.tfrecord")
    write_records(path, range(32))
    slow = _SlowCalls()
    loader = fl.Loader(fl.TFRecordStream(path, transform=slow), batch_size=4, num_workers=2, backend="thread",
                       device="cpu")
    next(iter(loader))
    loader.close()
    closed = time.monotonic()
    left = [t.name for t in threading.enumerate() if t.name.startswith("fastload-slot")]
    time.sleep(0.5)
    assert not left, f"slot threads running after close(): {left}"
    assert not [s for s in slow.starts if s > closed], "the transform was called after close() returned"


class _FailsAt:
    """Leaves every image as it is but raises a ValueError at its ``at``-th call."""

    def __init__(self, at):
        self.at, self.calls = at, 0

    def __call__(self, img, rng):
        self.calls += 1
        if self.calls == self.at:
            raise ValueError("bad image")
        return img


def test_a_stream_pass_on_threads_ended_by_an_error_leaves_no_reader_behind(tmp_path):
    # A fault injector: each pass ended by a sample's error kept its slot's reader (its open
    # shard files, a WebDataset's reader thread) past close(), until the cyclic gc ran: the
    # error's traceback held the consumer's frame, which held the error.
    import gc
    import os
    import threading

    from fastload.convert import convert

    src = tmp_path / "photos"
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for k in range(12):
            (src / f"c{c}" / f"{k}.jpg").write_bytes(__import__("tfrecord_files").tiny_jpeg(c * 12 + k))
    convert(str(src), str(tmp_path / "wds"), "wds", progress=False, shard_samples=6)
    shards = str(tmp_path / "wds")

    def open_shards():
        return [p for p in (os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                            if os.path.exists(f"/proc/self/fd/{fd}")) if p.startswith(shards)]

    gc.collect()  # earlier tests' garbage (their readers' threads among it) is not this test's
    before = set(threading.enumerate())
    was = gc.isenabled()
    gc.disable()
    try:
        fails = _FailsAt(10)
        loader = fl.Loader(fl.WebDataset(shards + "/shard-*.tar", transform=fails), batch_size=4,
                           num_workers=2, backend="thread", device="cpu")
        for _ in range(3):
            fails.calls = 0
            with pytest.raises(ValueError, match="bad image"):
                list(loader)
        loader.close()
        import time

        for _ in range(50):  # freed, their threads end as soon as they are scheduled (never, before: until gc)
            readers = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("fastload-shards")]
            if not readers and not open_shards():
                break
            time.sleep(0.1)
        assert not readers and not open_shards(), (readers, open_shards())
    finally:
        if was:
            gc.enable()
