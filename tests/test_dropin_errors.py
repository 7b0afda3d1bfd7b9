"""A batch's error raises in its turn and the pass goes on with the next batch, as DataLoader's
iterator goes on (issue 40, part 1): code that catches a bad batch's error around ``next()``
and carries on gets the rest of the epoch, in its order."""

import errno

import numpy as np
import pytest
import torch

import fastload as fl

CPU = dict(device="cpu", normalize=False)


class Flaky(torch.utils.data.Dataset):
    """Sample i is a 4x4 image of value i and label i; the samples in ``bad`` raise a KeyError."""

    def __init__(self, n, bad=()):
        self.n, self.bad = n, frozenset(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise KeyError(f"sample {i} is missing")
        return np.full((4, 4, 3), i, np.uint8), i


def drain(it):
    """Every ``next(it)`` until the pass ends: each batch's labels, or "KeyError" where it raised one."""
    got = []
    while True:
        try:
            _, y = next(it)
        except StopIteration:
            return got
        except KeyError:
            got.append("KeyError")
        else:
            got.append(y.tolist())


def with_errors(batches, bad):
    """``batches`` (label lists) with those holding a sample of ``bad`` replaced by "KeyError"."""
    return ["KeyError" if set(b) & set(bad) else b for b in batches]


@pytest.mark.parametrize("workers,backend,persistent", [
    (0, "process", False), (2, "process", False), (2, "process", True), (2, "thread", True),
])
def test_the_pass_goes_on_after_a_batchs_error_in_the_epochs_order(workers, backend, persistent):
    bad = {2, 3, 9}
    options = dict(shuffle=True, seed=4, num_workers=workers, persistent_workers=persistent, backend=backend, **CPU)
    with fl.DataLoader(Flaky(12), 2, **options) as good:
        whole = [[y.tolist() for _, y in good] for _ in range(2)]
    with fl.DataLoader(Flaky(12, bad), 2, **options) as loader:
        for epoch in range(2):  # and the next pass is whole again
            got = drain(iter(loader))
            assert got == with_errors(whole[epoch], bad) and got.count("KeyError") >= 2


def test_a_for_loop_still_ends_at_the_error_and_the_failed_batch_counts_as_handed_out():
    with fl.DataLoader(Flaky(6, {3}), 2, **CPU) as loader:
        seen = []
        with pytest.raises(KeyError, match="sample 3 is missing"):
            for _, y in loader:
                seen.append(y.tolist())
        assert seen == [[0, 1]]
        state = loader.state_dict()
    assert state["consumed"] == 2
    with fl.DataLoader(Flaky(6), 2, **CPU) as resumed:
        resumed.load_state_dict(state)
        assert [y.tolist() for _, y in resumed] == [[4, 5]]


def test_on_the_device_an_error_comes_after_the_batches_before_it(sim):
    # The device stage stages batches ahead of the hand-over; the error of one staged later
    # must not overtake (and lose) the batches queued before it.
    with fl.DataLoader(Flaky(12, {8}), 2, num_workers=1, device="cuda", pin_memory=True, normalize=False) as loader:
        assert drain(iter(loader)) == [[0, 1], [2, 3], [4, 5], [6, 7], "KeyError", [10, 11]]


class _Missing(torch.utils.data.Dataset):
    """Sample 2 is a missing file: an OSError with errno and filename, and a field of its own."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            error = FileNotFoundError(errno.ENOENT, "No such file", "/data/2.jpg")
            error.attempts = 3
            raise error
        return np.zeros((8, 8, 3), np.uint8), i


@pytest.mark.parametrize("runner", [dict(num_workers=0), dict(num_workers=1),
                                    dict(num_workers=1, backend="thread")])
def test_a_datasets_error_keeps_what_its_catcher_reads(runner):
    # A review found e.errno None: code that tests e.errno == ENOENT (as DataLoader's re-raise of
    # the original allows) broke; a dataset's own fields went missing too.
    with pytest.raises(FileNotFoundError) as got:
        list(fl.DataLoader(_Missing(), batch_size=4, **runner))
    e = got.value
    assert (e.errno, e.filename, e.attempts) == (errno.ENOENT, "/data/2.jpg", 3)
    assert isinstance(e, fl.SampleError) and e.index == 2
