"""Worker processes stopped or killed from outside: errors that name them, raised by next()."""

import faulthandler
import os
import re
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import fastload as fl

from conftest import children


class _Slow(fl.ImageDataset):
    """Every sample takes ``seconds`` to load, so workers are busy whenever the consumer is faster."""

    def __init__(self, n=120, seconds=0.02):
        super().__init__(np.zeros(n, np.int64))
        self.seconds = seconds

    def describe(self, index):
        return f"img-{index}.jpg"

    def load(self, index, epoch=0, seed=0):
        time.sleep(self.seconds)
        return np.zeros((4, 4, 3), np.uint8), 0


def new_worker(earlier: set[int]) -> int:
    """A worker of the loader just started (earlier tests may leave children behind)."""
    return min(children() - earlier)


@pytest.mark.slow  # 4-8 s: make test stays under 4 minutes (make test-slow runs it)
def test_a_stopped_worker_times_out_naming_it_and_the_next_pass_works():
    faulthandler.dump_traceback_later(60, exit=True)  # a regression hangs: end the run, loudly
    try:
        _stopped_worker_times_out()
    finally:
        faulthandler.cancel_dump_traceback_later()


def _stopped_worker_times_out():
    earlier = children()
    with fl.Loader(_Slow(), batch_size=4, num_workers=2, device="cpu", timeout=2, stall_warning=0) as loader:
        it = iter(loader)
        next(it)
        time.sleep(0.5)  # the workers fill their prefetch queue, then idle
        stopped = new_worker(earlier)
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        try:
            with pytest.raises(fl.WorkerFailure, match=rf"timed out.*worker \d \(pid {stopped}\) is stopped"):
                for _ in it:
                    pass
            assert time.monotonic() - start < 6, "the timeout did not hold"
        finally:
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert sum(len(y) for _, y in loader) == 120


def test_the_stall_warning_names_a_stopped_worker():
    earlier = children()
    with fl.Loader(_Slow(n=48), batch_size=4, num_workers=2, device="cpu", stall_warning=1) as loader:
        it = iter(loader)
        next(it)
        time.sleep(0.5)
        stopped = new_worker(earlier)
        os.kill(stopped, signal.SIGSTOP)
        threading.Timer(2.5, os.kill, (stopped, signal.SIGCONT)).start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert sum(len(y) for _, y in it) == 44
    stalls = [str(w.message) for w in caught if "no batch" in str(w.message)]
    assert stalls and f"(pid {stopped}) is stopped" in stalls[0], stalls


def test_a_worker_killed_during_the_step_is_raised_by_next_naming_its_sample():
    earlier = children()
    with fl.Loader(_Slow(), batch_size=4, num_workers=2, device="cpu", stall_warning=0) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        victim = new_worker(earlier)
        failure = None
        for step in range(20):
            if step == 1:
                os.kill(victim, signal.SIGKILL)
            time.sleep(0.1)  # the training step: torch's handler used to raise in here
            try:
                next(it)
            except fl.WorkerFailure as e:
                failure = e
                break
        assert failure is not None, "the death was never reported"
        assert f"(pid {victim})" in str(failure) and "killed by signal" in str(failure)
        assert "was loading sample" in str(failure) and ".jpg)" in str(failure)
        assert sum(len(y) for _, y in loader) == 120, "the very next pass must work"


class _Stuck(_Slow):
    """Sample ``stuck`` never finishes loading (a transform stuck in a lock, a hung read)."""

    def __init__(self, stuck, **kw):
        super().__init__(**kw)
        self.stuck = stuck

    release = threading.Event()  # set after the test: a thread of the thread backend cannot be killed

    def load(self, index, epoch=0, seed=0):
        if index == self.stuck:
            self.release.wait(60)
        return super().load(index, epoch, seed)


def test_a_worker_killed_between_samples_is_said_to_have_held_none():
    earlier = children()
    with fl.Loader(_Slow(), batch_size=4, num_workers=2, device="cpu", stall_warning=0) as loader:
        it = iter(loader)
        next(it)
        time.sleep(1.0)  # both workers have filled their prefetch queue and idle
        victim = new_worker(earlier)
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(fl.WorkerFailure) as failure:
            for _ in it:
                time.sleep(0.05)
    message = str(failure.value)
    assert f"(pid {victim}) was loading no sample: no batch was in progress there" in message, message
    assert "its batch is lost" not in message and ". ;" not in message, message


@pytest.mark.slow  # 4-8 s: make test stays under 4 minutes (make test-slow runs it)
def test_a_stopped_worker_in_a_sample_times_out_saying_stopped():
    earlier = children()
    with fl.Loader(_Slow(n=40, seconds=0.3), batch_size=4, num_workers=2, device="cpu", timeout=2,
                   stall_warning=0) as loader:
        it = iter(loader)
        next(it)
        stopped = new_worker(earlier)
        os.kill(stopped, signal.SIGSTOP)  # in the middle of a sample: each takes 0.3 s
        try:
            with pytest.raises(fl.WorkerFailure) as failure:
                for _ in it:
                    pass
        finally:
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert re.search(rf"worker \d \(pid {stopped}\), stopped, was loading sample \d+ \(img-\d+\.jpg\)",
                     str(failure.value)), str(failure.value)


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_a_stuck_sample_times_out_after_the_timeout(backend):
    _Stuck.release.clear()
    try:
        with fl.Loader(_Stuck(9, n=40), batch_size=4, num_workers=2, device="cpu", timeout=2, stall_warning=0,
                       backend=backend) as loader:
            start = time.monotonic()
            with pytest.raises(fl.WorkerFailure, match=r"timed out.*was loading sample 9 \(img-9\.jpg\)"):
                for _ in loader:
                    pass
            waited = time.monotonic() - start
    finally:
        _Stuck.release.set()
    # The timeout, not the timeout plus the stuck worker's shutdown (3 s more, before).
    assert waited < 3.5, f"the error came {waited:.1f} s after the pass started, timeout=2"
