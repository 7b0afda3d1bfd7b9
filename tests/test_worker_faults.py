"""Worker processes stopped or killed from outside: errors that name them, raised by next()."""

import faulthandler
import os
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
