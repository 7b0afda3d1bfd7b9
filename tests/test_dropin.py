"""fl.DataLoader, the drop-in: DataLoader's signature, positional order and defaults; fl.Loader
takes positional arguments and dataset= as DataLoader does; DataLoader's refusals of
contradicting arguments and of attributes set after construction (issue 40, part 1)."""

import inspect
import multiprocessing
import os
import re

import numpy as np
import pytest
import torch

import fastload as fl

CPU = dict(device="cpu", normalize=False)


class Plain(torch.utils.data.Dataset):
    """A user's map-style dataset: sample i is a 4x4 image of value i and label i."""

    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((4, 4, 3), i, np.uint8), i


def labels(loader):
    return [y.tolist() for _, y in loader]


def test_the_signature_is_dataloaders():
    theirs = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    ours = inspect.signature(fl.DataLoader.__init__).parameters
    names = list(theirs)
    assert list(ours)[: len(names)] == names, "the same parameters in the same order"
    for name in names:
        assert (ours[name].kind, ours[name].default) == (theirs[name].kind, theirs[name].default), name
    # What follows is fastload's own options, by keyword only.
    assert [p.kind for p in list(ours.values())[len(names):]] == [inspect.Parameter.VAR_KEYWORD]


def test_omitted_keywords_mean_what_they_mean_in_dataloader(monkeypatch):
    # Under torch.distributed too: without a sampler this process reads every sample.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    ds = Plain(5)
    with fl.DataLoader(ds, **CPU) as loader:
        assert (loader.batch_size, loader.num_workers, loader.persistent_workers) == (1, 0, False)
        assert (loader.config.shuffle, loader.drop_last, loader.pin_memory, loader.config.timeout) == (
            False, False, False, 0)
        assert labels(loader) == [[0], [1], [2], [3], [4]] and len(loader) == 5
    with fl.Loader(ds, **CPU) as native:  # fastload's defaults stay fl.Loader's
        assert (native.batch_size, native.persistent_workers, native.world_size) == (256, True, 2)


def test_positional_arguments_in_dataloaders_order():
    ds = Plain(10)
    with fl.DataLoader(ds, 4, True, None, None, 0, None, False, True, seed=3, **CPU) as a, \
            fl.Loader(ds, 4, True, None, None, 0, None, False, True, seed=3, **CPU) as b, \
            fl.Loader(dataset=ds, batch_size=4, shuffle=True, drop_last=True, num_workers=0, seed=3, **CPU) as c:
        assert labels(a) == labels(b) == labels(c) and len(a) == 2
        assert a.config.shuffle and a.drop_last
    with fl.DataLoader(dataset=ds, batch_size=5, **CPU) as d:
        assert labels(d) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_positional_mistakes_say_what_to_write():
    ds = Plain(4)
    with pytest.raises(TypeError, match="fl.Loader got multiple values for argument 'batch_size'"):
        fl.Loader(ds, 2, batch_size=2, **CPU)
    with pytest.raises(TypeError, match="fl.Loader needs a dataset: fl.Loader\\(dataset, batch_size=...\\)"):
        fl.Loader(batch_size=2)
    with pytest.raises(TypeError, match="at most 13 positional arguments .* give the rest by keyword"):
        fl.Loader(ds, *([None] * 13))
    with pytest.raises(TypeError, match=r"takes the options after the config by keyword"):
        fl.Loader(ds, fl.LoaderConfig(), 4)
    with fl.Loader(ds, fl.LoaderConfig(batch_size=3, num_workers=0), **CPU) as loader:
        assert loader.batch_size == 3, "a LoaderConfig by position, as before"


@pytest.mark.parametrize("kwargs,says", [
    (dict(num_workers=0, prefetch_factor=2), "prefetch_factor=2 needs num_workers > 0"),
    (dict(num_workers=0, persistent_workers=True), "persistent_workers=True needs num_workers > 0"),
    (dict(num_workers=0, multiprocessing_context="spawn"), "num_workers=0 .*, with multiprocessing_context='spawn'"),
    (dict(sampler="dist", shuffle=True), r"got sampler=DistributedSampler\(...\) and shuffle=True"),
    (dict(sampler="random", shuffle=True), r"got sampler=RandomSampler\(...\) and shuffle=True"),
    (dict(batch_sampler=[[0, 1]], batch_size=2), "batch_sampler option is mutually exclusive .* got batch_size=2"),
    (dict(batch_sampler=[[0, 1]], drop_last=True), "got drop_last=True"),
    (dict(batch_size=None, drop_last=True), "mutually exclusive with drop_last .* got drop_last=True"),
    (dict(num_workers=-1), "got num_workers=-1"),
    (dict(timeout=-1), "got timeout=-1"),
    (dict(num_workers=-1, timeout=-1, prefetch_factor=2), "got num_workers=-1"),  # DataLoader's order of checks
])
def test_argument_combinations_dataloader_refuses_are_value_errors(kwargs, says):
    ds = Plain(4)
    samplers = {"dist": torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0),
                "random": torch.utils.data.RandomSampler(ds)}
    kwargs = {k: samplers.get(v, v) if isinstance(v, str) and k == "sampler" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=says):
        fl.DataLoader(ds, **CPU, **kwargs)


def test_an_iterable_dataset_with_shuffle_is_dataloaders_value_error():
    with pytest.raises(ValueError, match="expected unspecified shuffle option, but got shuffle=True"):
        fl.DataLoader(Stream(), shuffle=True)
    with pytest.warns(RuntimeWarning, match="given Stream, an IterableDataset runs as torch.utils.data.DataLoader"):
        assert type(fl.DataLoader(Stream())) is torch.utils.data.DataLoader


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(())


@pytest.mark.parametrize("kwargs", [
    dict(num_workers=-1), dict(timeout=-1), dict(batch_size=None, drop_last=True),
    dict(num_workers=0, multiprocessing_context="spawn"), dict(num_workers=1, multiprocessing_context="thread"),
    dict(num_workers=1, multiprocessing_context=3.5), dict(sampler="in order", shuffle=True),
    dict(batch_sampler=[[0, 1]], batch_size=2), dict(batch_sampler=[[0, 1]], drop_last=True),
    dict(stream=True, shuffle=True), dict(stream=True, sampler="in order"), dict(stream=True, batch_sampler=[[0]]),
])
def test_refusals_are_dataloaders_type_and_begin_with_its_words(kwargs):
    # Its message, searched for, still leads to ours: ours begins with it, up to where it names the value.
    kwargs = dict(kwargs)
    ds = Stream() if kwargs.pop("stream", False) else Plain(4)
    if kwargs.get("sampler") == "in order":
        kwargs["sampler"] = torch.utils.data.SequentialSampler(range(4))
    with pytest.raises(Exception) as theirs:
        torch.utils.data.DataLoader(ds, **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        fl.DataLoader(ds, **CPU, **kwargs)
    words = re.split(r", but got|;", str(theirs.value))[0]
    assert str(ours.value).startswith(words), (str(ours.value), words)


class Reversed(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))


def _first_ids(batch):
    return batch


# What only torch's DataLoader can honour: a keyword that hands batching, order or worker
# setup to the user's code, no batching, an IterableDataset of the user's.
TORCH_ONLY = [
    ("collate_fn", dict(batch_size=2, collate_fn=_first_ids)),
    ("worker_init_fn", dict(batch_size=2, num_workers=1, worker_init_fn=print)),
    ("batch_sampler", dict(batch_sampler=[[3, 0], [1]])),
    ("batch_size", dict(batch_size=None)),
    ("sampler", dict(batch_size=3, sampler=Reversed(4))),
]


@pytest.mark.parametrize("keyword,kwargs", TORCH_ONLY, ids=[k for k, _ in TORCH_ONLY])
def test_what_only_torchs_dataloader_honours_runs_as_it_and_says_so(keyword, kwargs):
    with pytest.warns(RuntimeWarning, match=f"fl.DataLoader given {keyword}=.* runs as torch.utils.data.DataLoader: "
                      "nothing of fastload runs \\(for fastload's loader: "):
        ours = fl.DataLoader(Plain(4), **kwargs)
    assert type(ours) is torch.utils.data.DataLoader  # the object DataLoader(...) is: its attributes, its errors
    theirs = torch.utils.data.DataLoader(Plain(4), **kwargs)
    batches = list(ours)
    assert len(batches) == len(theirs) and len(batches) > 0
    assert repr(batches) == repr(list(theirs))


@pytest.mark.parametrize("keyword,kwargs", TORCH_ONLY, ids=[k for k, _ in TORCH_ONLY])
def test_fastloads_options_beside_what_only_torch_honours_are_refused_naming_both(keyword, kwargs):
    with pytest.raises(TypeError, match=f"fl.DataLoader given {keyword}=.* is torch.utils.data.DataLoader, which "
                       "takes none of fastload's options \\(device=, normalize=\\): leave them out; or, for "
                       "fastload's loader: "):
        fl.DataLoader(Plain(4), **CPU, **kwargs)


def test_a_datapipe_takes_shuffle_as_in_dataloader():
    IterableWrapper = pytest.importorskip("torch.utils.data.datapipes.iter").IterableWrapper
    pipe = IterableWrapper(range(64)).shuffle()
    for shuffle in (True, False):
        with pytest.warns(RuntimeWarning, match="an IterableDataset runs as torch"):
            ours = fl.DataLoader(pipe, batch_size=64, shuffle=shuffle)
        (batch,) = ours
        assert sorted(batch.tolist()) == list(range(64))
        assert (batch.tolist() != list(range(64))) is shuffle  # shuffle= set the pipe's shuffler, as in DataLoader


def test_a_subclass_keeps_fastloads_path_and_refusals():
    class Mine(fl.DataLoader):
        def __init__(self, dataset, **kwargs):
            super().__init__(dataset, **kwargs)

    with Mine(Plain(4), batch_size=2, **CPU) as loader:
        assert labels(loader) == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="fl.Mine does not take collate_fn="):
        Mine(Plain(4), batch_size=2, collate_fn=_first_ids)


def test_a_fastload_stream_with_what_only_torch_honours_is_refused_not_handed_to_torch(tmp_path):
    from tfrecord_files import write_shards

    stream = fl.TFRecordStream(write_shards(tmp_path, [4]))
    with pytest.raises(TypeError, match="fl.DataLoader does not take collate_fn="):
        fl.DataLoader(stream, batch_size=2, collate_fn=_first_ids)


def test_torchs_newer_keywords_are_left_out_at_their_defaults():
    from fastload.loading.compat import torch_arguments

    assert "in_order" not in torch_arguments({"batch_size": 2, "in_order": True})
    assert torch_arguments({"in_order": False}) == {"in_order": False}


class NestedItems(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        rows = [torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(i + 1, 3, dtype=torch.uint8)]
        return torch.nested.nested_tensor(rows), i


def test_nested_tensor_items_run_as_torchs_dataloader_and_fail_as_there():
    with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
        list(torch.utils.data.DataLoader(NestedItems(), batch_size=2))
    with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
        list(fl.DataLoader(NestedItems(), batch_size=2))


def test_a_nested_tensor_item_is_not_an_image():
    from fastload.datasets.wrap import to_hwc_uint8

    nested = torch.nested.nested_tensor([torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.uint8)])
    with pytest.raises(TypeError, match="the image field is a nested tensor, not an image"):
        to_hwc_uint8(nested)


def test_a_config_is_refused_naming_fl_loader():
    # Its values would be lost under DataLoader's defaults (batch_size=1, num_workers=0, ...).
    with pytest.raises(TypeError, match=r"does not take config=.*fl\.Loader\(ds, config=\.\.\.\)"):
        fl.DataLoader(Plain(4), config=fl.LoaderConfig(batch_size=2, device="cpu", normalize=False))


def test_dataloaders_keywords_with_their_values_change_nothing():
    ds = Plain(6)
    given = dict(batch_size=2, shuffle=False, sampler=None, batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, prefetch_factor=None, persistent_workers=False, pin_memory_device="", in_order=True)
    with fl.DataLoader(ds, seed=1, **CPU, **given) as a, fl.DataLoader(ds, 2, seed=1, **CPU) as b:
        assert labels(a) == labels(b) == [[0, 1], [2, 3], [4, 5]] and a.config == b.config


def test_workers_with_a_multiprocessing_context():
    ds = Plain(6)
    with fl.DataLoader(ds, 3, num_workers=1, multiprocessing_context=multiprocessing.get_context("fork"),
                       **CPU) as loader:
        assert loader.config.multiprocessing_context == "fork" and labels(loader) == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("attr", ["dataset", "batch_size", "sampler", "batch_sampler", "drop_last",
                                  "persistent_workers", "num_workers", "pin_memory", "timeout", "prefetch_factor",
                                  "multiprocessing_context"])
def test_setting_dataloaders_fixed_attributes_is_a_value_error(attr):
    # DataLoader applies num_workers, pin_memory, timeout, prefetch_factor and the context at
    # its next iter(); a Loader's workers start with it, so a value set would silently go unused
    # (a user's `loader.num_workers = 0` to debug went on with 2 worker processes).
    for kind in (fl.DataLoader, fl.Loader):
        with kind(Plain(4), num_workers=0, **CPU) as loader:
            before = getattr(loader, attr)
            with pytest.raises(ValueError, match=f"{attr} attribute should not be set after {kind.__name__} is "
                                                 f"initialized \\(got {attr}=5\\)"):
                setattr(loader, attr, 5)
            assert getattr(loader, attr) is before or getattr(loader, attr) == before


@pytest.mark.parametrize("n,kwargs", [(0, {}), (10, dict(batch_size=16, drop_last=True)),
                                      (10, dict(batch_size=4, drop_last=True, world=4)),
                                      (3, dict(batch_size=4, world=4, uneven=True))])
def test_a_dataloader_with_no_batch_yields_none_as_torchs(n, kwargs):
    # An empty dataset, or too few samples per rank for one batch with drop_last: DataLoader
    # yields nothing (len 0); fl.DataLoader was a ValueError at construction. fl.Loader (and
    # fl.DataLoader given fastload's own options) still names it.
    kwargs = dict(kwargs)
    world, uneven = kwargs.pop("world", 1), kwargs.pop("uneven", False)
    if world > 1:
        kwargs["sampler"] = torch.utils.data.distributed.DistributedSampler(Plain(n), world, world - 1, drop_last=uneven)
    want = torch.utils.data.DataLoader(Plain(n), **kwargs)
    with fl.DataLoader(Plain(n), **kwargs) as got:  # a Loader's context manager and set_epoch, as a user writes them
        got.set_epoch(1)
        assert isinstance(got, torch.utils.data.DataLoader)
        assert len(got) == len(want) == 0 and list(got) == list(want) == []
    with pytest.raises(ValueError, match="empty|no batch to yield"):
        fl.Loader(Plain(n), num_workers=0, **CPU, **kwargs)
    with pytest.raises(ValueError, match="empty|no batch to yield"):
        fl.DataLoader(Plain(n), **CPU, **kwargs)
    with pytest.raises(ValueError, match="empty|no batch to yield"):  # "auto" is fastload's own: the Loader names it
        fl.DataLoader(Plain(n), num_workers="auto", **kwargs)


def test_repr_names_the_class_made():
    with fl.DataLoader(Plain(4), 2, **CPU) as a, fl.Loader(Plain(4), 2, **CPU) as b:
        assert repr(a).startswith("DataLoader(Plain[4], batch_size=2,") and repr(b).startswith("Loader(Plain[4], ")


def test_subscriptable_for_annotations():
    assert fl.DataLoader[int].__origin__ is fl.DataLoader and fl.Loader[tuple].__origin__ is fl.Loader
    assert issubclass(fl.DataLoader, fl.Loader)



class Growing(Plain):
    """A dataset that grows between passes (new files found, a replay buffer)."""


@pytest.mark.parametrize("kind,workers,backend", [(fl.DataLoader, 0, "process"), (fl.DataLoader, 1, "process"),
                                                  (fl.Loader, 1, "process"), (fl.Loader, 2, "thread")])
def test_len_and_passes_follow_a_dataset_that_grows(kind, workers, backend):
    ds = Growing(6)
    with kind(ds, batch_size=4, num_workers=workers, backend=backend, **CPU) as loader:
        assert len(loader) == 2 and sum(labels(loader), []) == list(range(6))
        ds.n = 10
        assert len(loader) == 3, "len(loader) follows len(dataset), as DataLoader's"
        assert sum(labels(loader), []) == list(range(10)), "and the next pass reads the new samples"
        assert len(loader.sampler) == 10
        ds.n = 0
        with pytest.raises(ValueError, match="dataset is empty"):
            len(loader)


class Reporting(Plain):
    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return np.full((4, 4, 3), i, np.uint8), i, info.dataset is self if info is not None else None


@pytest.mark.parametrize("backend", ["process", "spawn"])
def test_get_worker_info_dataset_is_the_users_dataset(backend):
    ds = Reporting(4)
    context = "spawn" if backend == "spawn" else None
    with fl.DataLoader(ds, 2, num_workers=1, multiprocessing_context=context, **CPU) as loader:
        seen = [flags for _, _, flags in loader]
    # Under spawn the worker's copy is the dataset (pickled): `is self` compares with that copy.
    assert [f.tolist() for f in seen] == [[True, True], [True, True]]


def test_a_subset_of_a_users_dataset_is_shown_as_given():
    class Shows(Plain):
        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return np.full((4, 4, 3), i, np.uint8), i, type(info.dataset).__name__

    part = torch.utils.data.Subset(Shows(6), [1, 3])
    (_, labels_, names), = list(fl.DataLoader(part, 2, num_workers=1, **CPU))
    assert labels_.tolist() == [1, 3] and names == ("Subset", "Subset")


def test_a_dataset_of_no_images_runs_as_torchs_dataloader():
    # Issue 40: PyTorch's own DataLoader tests fed numbers and vectors and got fastload's "not an
    # image" error; the one-line swap runs such a dataset as torch's DataLoader, same arguments.
    ds = torch.utils.data.TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    for kwargs in (dict(batch_size=3), dict(batch_size=4, shuffle=True, drop_last=True), dict(num_workers=2)):
        ours = fl.DataLoader(ds, generator=torch.Generator().manual_seed(1), **kwargs)
        theirs = torch.utils.data.DataLoader(ds, generator=torch.Generator().manual_seed(1), **kwargs)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert isinstance(ours.generic, torch.utils.data.DataLoader)
    images = fl.DataLoader([(np.zeros((8, 8, 3), np.uint8), 0)] * 4, batch_size=2)
    assert images.generic is None and len(list(images)) == 2  # images keep fastload's path


class _Barrier(torch.utils.data.Dataset):
    """Each item waits until every worker has read one (PyTorch's SynchronizedSeedDataset): an
    item read anywhere else first (a look at item 0 in the main process) waits forever."""

    def __init__(self, workers):
        self.count = multiprocessing.Value("i", 0, lock=True)
        self.barrier = multiprocessing.Semaphore(0)
        self.workers = workers
        self.outside = multiprocessing.Value("i", 0, lock=True)  # items read outside the workers

    def __len__(self):
        return self.workers

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is None:
            with self.outside.get_lock():
                self.outside.value += 1
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.workers:
                self.barrier.release()
        if not self.barrier.acquire(timeout=10):
            raise TimeoutError("the barrier was not reached: an item was read outside the workers")
        self.barrier.release()
        return torch.initial_seed()


def test_items_that_are_not_images_are_told_apart_in_the_workers():
    # Issue 40: fl.DataLoader looked at item 0 in the main process to tell images from other
    # data; PyTorch's test_worker_seed waits there forever. The workers decide where they read.
    ds = _Barrier(3)
    seeds = [int(s) for s in fl.DataLoader(ds, batch_size=1, num_workers=3)]
    assert len(set(seeds)) == 3  # one item in each worker, each worker seeded as torch seeds it
    assert ds.outside.value == 0

    def seeds_of(loader):
        return sorted(int(s) for s in loader)

    again = [seeds_of(fl.DataLoader(_Barrier(3), batch_size=1, num_workers=3,
                                    generator=torch.Generator().manual_seed(42))) for _ in range(2)]
    theirs = seeds_of(torch.utils.data.DataLoader(_Barrier(3), batch_size=1, num_workers=3,
                                                  generator=torch.Generator().manual_seed(42)))
    assert again[0] == again[1] == theirs


def test_under_on_error_skip_items_that_are_not_images_are_sample_errors():
    # on_error="skip" (fastload's option) skips what a sample's conversion refuses, wherever it
    # comes: all of them refused, the batch is named as failed.
    ds = torch.utils.data.TensorDataset(torch.arange(8.0))
    with pytest.raises(fl.SampleError, match="replacements failed.*tuple of 1"):
        next(iter(fl.DataLoader(ds, batch_size=4, on_error="skip", **CPU)))
    with pytest.raises(TypeError, match="sample 0: the item is a tuple of 1") as raised:  # fl.Loader: its error
        next(iter(fl.Loader(ds, batch_size=4, num_workers=0, **CPU)))
    assert not isinstance(raised.value, fl.datasets.wrap.ItemsNotImages)


class _Damaged(Plain):
    """Images, but sample 4 (worker 1's first read with batches of 4 on 2 workers) is damaged
    bytes, not an image."""

    def __getitem__(self, i):
        return (b"", i) if i == 4 else super().__getitem__(i)


def test_a_damaged_item_first_in_a_worker_is_skipped_every_epoch():
    loader = fl.DataLoader(_Damaged(16), batch_size=4, num_workers=2, on_error="skip", **CPU)
    for epoch in range(2):
        batches = list(loader)
        assert len(batches) == 4 and all(x.dtype == torch.uint8 for x, _ in batches), epoch
    assert loader.generic is None and [s.index for s in loader.skipped] == [4, 4]


class _FirstFails(Plain):
    def __getitem__(self, i):
        if i == 0:
            raise KeyError("sample 0 is gone")
        return super().__getitem__(i)


def test_the_first_pass_goes_on_after_a_batch_error_before_the_images_are_seen():
    loader = fl.DataLoader(_FirstFails(4), batch_size=2, **CPU)
    it = iter(loader)
    with pytest.raises(KeyError, match="sample 0 is gone"):
        next(it)
    assert [y.tolist() for _, y in it] == [[2, 3]]  # the pass goes on, as DataLoader's does
    assert loader.generic is None


def _alive(pid):
    try:
        os.waitpid(pid, os.WNOHANG)  # reaped if it ended (a child of this process)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_dropped_dataloader_of_no_images_stops_torchs_persistent_workers_at_once():
    # The first pass's "not images" error held fastload's pass and torch's iterator in a cycle:
    # freed by a later gc, the iterator found its queues closed and waited 5 s per worker.
    loader = fl.DataLoader(torch.utils.data.TensorDataset(torch.arange(8)), batch_size=2, num_workers=2,
                           persistent_workers=True)
    assert len(list(loader)) == 4
    ours = list(loader._source.inflight.pids().values())  # fastload's, persistent: let go at the switch
    assert len(ours) == 2 and not any(_alive(pid) for pid in ours)
    workers = list(loader.generic._iterator._workers)  # torch's
    del loader
    for w in workers:
        w.join(3)
    assert not any(w.is_alive() for w in workers)


class _NoneFirst(Plain):
    """Images, but sample 0 is missing: None, a dataset's way to say its file is damaged."""

    def __getitem__(self, i):
        return (None, i) if i == 0 else super().__getitem__(i)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_missing_first_image_is_skipped_not_taken_for_data_that_is_not_images(num_workers):
    # The first item a worker reads decides images or not; a None there is a damaged sample.
    loader = fl.DataLoader(_NoneFirst(8), batch_size=2, num_workers=num_workers, on_error="skip", **CPU)
    batches = list(loader)
    assert loader.generic is None and len(batches) == 4
    assert all(x.dtype == torch.uint8 and x.shape == (2, 3, 4, 4) for x, _ in batches)
    assert [s.index for s in loader.skipped] == [0]


class _Floats(Plain):
    """A torchvision-style dataset: ToTensor()'s float C×H×W images."""

    def __getitem__(self, i):
        return torch.full((3, 4, 4), i / 10), i


def test_float_images_run_as_dataloader_and_say_so():
    ours = fl.DataLoader(_Floats(6), batch_size=3)
    with pytest.warns(RuntimeWarning, match=r"as torch.utils.data.DataLoader .* not uint8 images .*float32"):
        got = list(ours)
    theirs = list(torch.utils.data.DataLoader(_Floats(6), batch_size=3))
    assert all(torch.equal(a, b) for x, y in zip(got, theirs, strict=True) for a, b in zip(x, y, strict=True))


class _NumbersFirstFails(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 0:
            raise KeyError("sample 0 is gone")
        return i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_error_before_the_items_are_known_is_not_raised_twice(num_workers):
    # The pass goes on after it, as torch's does, also once it runs as torch's DataLoader.
    def passes(loader):
        it, out = iter(loader), []
        while True:
            try:
                out.append(next(it).tolist())
            except StopIteration:
                return out
            except KeyError:
                out.append("KeyError")

    ours = passes(fl.DataLoader(_NumbersFirstFails(), batch_size=2, num_workers=num_workers))
    assert ours == passes(torch.utils.data.DataLoader(_NumbersFirstFails(), batch_size=2, num_workers=num_workers))
    assert ours == ["KeyError", [2, 3], [4, 5]]


class _DamagedFirst(Plain):
    """Images, but sample 0 is damaged: ``kind`` says how."""

    def __init__(self, kind, n=8):
        super().__init__(n)
        self.kind = kind

    def __getitem__(self, i):
        if i == 0:
            bad = {"bytes": b"", "two channels": np.zeros((5, 5, 2), np.uint8)}[self.kind]
            return bad, 0
        return super().__getitem__(i)


@pytest.mark.parametrize("kind", ["bytes", "two channels"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_damaged_first_image_is_its_samples_error_not_data_of_another_kind(kind, num_workers):
    loader = fl.DataLoader(_DamagedFirst(kind), batch_size=2, num_workers=num_workers, **CPU)
    for _ in range(2):  # every epoch: the error in its batch's turn, then the images
        it = iter(loader)
        with pytest.raises(TypeError, match="sample 0: ") as raised:
            next(it)
        assert not isinstance(raised.value, fl.datasets.wrap.ItemsNotImages)
        assert [y.tolist() for _, y in it] == [[2, 3], [4, 5], [6, 7]]
    assert loader.generic is None


def test_close_lets_torchs_dataloader_go():
    loader = fl.DataLoader(torch.utils.data.TensorDataset(torch.arange(8)), batch_size=2, num_workers=2,
                           persistent_workers=True)
    assert len(list(loader)) == 4
    workers = list(loader.generic._iterator._workers)  # torch's
    loader.close()
    for w in workers:
        w.join(3)
    assert not any(w.is_alive() for w in workers)
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_arrays_of_numbers_in_no_images_shape_are_data_not_damaged_images():
    # PyTorch's own tests batch TensorDataset(torch.randn(100, 2, 3, 5), ...): data, not pixels.
    ds = torch.utils.data.TensorDataset(torch.randn(10, 2, 3, 5), torch.arange(10))
    ours = fl.DataLoader(ds, batch_size=4, num_workers=2)
    got = list(ours)
    theirs = list(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2))
    assert all(torch.equal(a, b) for x, y in zip(got, theirs, strict=True) for a, b in zip(x, y, strict=True))
    assert isinstance(ours.generic, torch.utils.data.DataLoader)
