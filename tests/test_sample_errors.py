"""A dataset's own exception keeps its type on every backend (issue 40, part 1): raised as an
error of that type that is a fl.SampleError too, naming the sample, with the worker's traceback
(as DataLoader re-raises it); a plain SampleError where the type cannot be made again."""

import numpy as np
import pytest
import torch

import fastload as fl

CPU = dict(device="cpu", normalize=False)


class Plain(torch.utils.data.Dataset):
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((4, 4, 3), i, np.uint8), i


def labels(loader):
    return [y.tolist() for _, y in loader]


class TwoArgumentError(Exception):
    def __init__(self, code, text):
        super().__init__(code, text)


class Failing(Plain):
    """Sample 5 raises ``kind`` from __getitem__, as a user's dataset does."""

    def __init__(self, kind, n=8):
        super().__init__(n)
        self.kind = kind

    def __getitem__(self, i):
        if i == 5:
            raise self.kind(7, "no such row") if self.kind is TwoArgumentError else self.kind("no such row")
        return super().__getitem__(i)


BACKENDS = {"in-process": dict(num_workers=0), "process": dict(num_workers=1),
            "thread": dict(num_workers=2, backend="thread"),
            "spawn": dict(num_workers=1, multiprocessing_context="spawn")}


KINDS = [KeyError, NotImplementedError, FileNotFoundError, ValueError]


# Every type on the three backends; spawned workers (a second or two each to start) with one.
@pytest.mark.parametrize("kind,backend", [(k, b) for b in ("in-process", "process", "thread") for k in KINDS]
                         + [(KeyError, "spawn")])
def test_a_datasets_exception_keeps_its_type(kind, backend):
    with pytest.raises(kind) as info, fl.DataLoader(Failing(kind), 2, **BACKENDS[backend], **CPU) as loader:
        list(loader)
    error = info.value
    assert isinstance(error, fl.SampleError) and error.index == 5, "still a SampleError naming its sample"
    assert str(error).startswith(f"sample 5: {kind.__name__}: ") and "no such row" in str(error)
    if backend in ("process", "spawn"):  # the worker's traceback, the dataset's own frame included
        assert "Raised in DataLoader worker process 0; its traceback there:" in str(error)
        assert "in __getitem__" in str(error) and "The above exception was the direct cause" in str(error)
    else:
        assert type(error.__cause__) is kind, "the dataset's own error is the cause"


@pytest.mark.parametrize("backend", ["in-process", "process"])
def test_an_error_type_that_cannot_be_made_from_a_message_is_a_sample_error(backend):
    with pytest.raises(fl.SampleError) as info, \
            fl.DataLoader(Failing(TwoArgumentError), 2, **BACKENDS[backend], **CPU) as loader:
        list(loader)
    assert not isinstance(info.value, TwoArgumentError) and info.value.index == 5
    assert "sample 5: TwoArgumentError: (7, 'no such row')" in str(info.value)


@pytest.mark.filterwarnings("ignore:fastload. skipped")
def test_on_error_skip_still_skips_and_records_the_error():
    with fl.DataLoader(Failing(KeyError), 4, on_error="skip", seed=0, **CPU) as loader:
        got = sum(labels(loader), [])
    assert 5 not in got and len(got) == 8
    assert [(s.index, s.error) for s in loader.skipped] == [(5, "KeyError: 'no such row'")]


class _Refuses:
    """A transform that raises NotImplementedError for the image whose pixels sum to ``odd``."""

    def __init__(self, odd):
        self.odd = odd

    def __call__(self, img, rng):
        if int(img.sum()) == self.odd:
            raise NotImplementedError("this kind of record")
        return img


@pytest.mark.parametrize("workers", [0, 2])
def test_a_streams_record_error_keeps_its_type(tmp_path, monkeypatch, workers):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from tfrecord_files import tiny_jpeg, write_records

    from fastload.decode import decode_image

    path = str(tmp_path / "one.tfrecord")
    write_records(path, range(12))
    stream = fl.TFRecordStream(path, transform=_Refuses(int(decode_image(tiny_jpeg(7)).sum())))
    with pytest.raises(NotImplementedError) as info, \
            fl.Loader(stream, batch_size=4, num_workers=workers, device="cpu") as loader:
        list(loader)
    assert isinstance(info.value, fl.SampleError) and info.value.index == 7
    assert "one.tfrecord" in info.value.where and "this kind of record" in str(info.value)
    assert ("Raised in DataLoader worker process" in str(info.value)) == (workers > 0)
