"""A DataLoader training script moved to fastload by changing only its constructors
(imagenet_style.py, after PyTorch's examples/imagenet/main.py) keeps its meaning: under
torchrun on 2 CPU ranks with a DistributedSampler, and in one process."""

import json
import os

import pytest

from conftest import write_folder
from torchrun import failure, torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN, VAL = 40, 21  # one image per class: a label is the sample's index


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet_style")
    write_folder(root / "train", num_classes=TRAIN, per_class=1, size=(20, 24))
    write_folder(root / "val", num_classes=VAL, per_class=1, size=(20, 24), seed=1)
    return str(root)


def _torchrun(tmp_path, *args):
    proc = torchrun(os.path.join(HERE, "imagenet_style.py"), *args, "--checkpoint-dir", tmp_path,
                    "--record", tmp_path / "seen", timeout=240)
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, failure(proc)
    return [json.loads((tmp_path / f"seen.{r}.json").read_text())["runs"] for r in (0, 1)]


def _check_shards(ranks, epochs):
    for e in map(str, epochs):
        a, b = (r["train"][e] for r in ranks)
        assert len(a) == len(b) == TRAIN // 2, "equal shards"
        assert sorted(a + b) == list(range(TRAIN)), "disjoint shards that cover the dataset"
        assert a != sorted(a) and b != sorted(b), f"epoch {e} is not shuffled"
    for r in ranks:
        orders = [r["train"][str(e)] for e in epochs]
        assert all(x != y for x, y in zip(orders, orders[1:])), "the order must change each epoch"


def _check_validation(ranks, epochs):
    for rank, r in enumerate(ranks):
        assert r["val_sampler_len"] == VAL // 2, "len(val_loader.sampler): this rank's samples"
        for e in map(str, epochs):
            assert r["val"][e] == list(range(rank, VAL - 1, 2)), "DistributedSampler(shuffle=False, drop_last=True)"
            assert r["aux"][e] == [VAL - 1], "sampler=None: every rank reads the left-over sample"


@pytest.mark.slow  # torchrun with 2 ranks: 7 s
def test_imagenet_style_script_under_torchrun(data, tmp_path):
    ranks = _torchrun(tmp_path, data, "--epochs", "3", "--seed", "7", "--rerun-from", "2")
    first = [r[0] for r in ranks]
    _check_shards(first, range(3))
    _check_validation(first, range(3))
    for whole, resumed in ((r[0], r[1]) for r in ranks):
        assert list(resumed["train"]) == ["2"], "the resumed run starts at the checkpoint's epoch"
        assert resumed["train"]["2"] == whole["train"]["2"], "set_epoch(2) after a resume: epoch 2's order"
        assert resumed["crops"]["2"] == whole["crops"]["2"], "torch.manual_seed: the same crops again"
        assert whole["crops"]["0"] != whole["crops"]["1"]


def _one_process(data, tmp_path, *args):
    from imagenet_style import main

    record = main([data, "--epochs", "1", "--workers", "0", "--checkpoint-dir", str(tmp_path),
                   "--record", str(tmp_path / "one"), *args])
    return record["runs"][0]["train"][0]


def test_imagenet_style_script_in_one_process_follows_torch_manual_seed(data, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one, again, two = (_one_process(data, tmp_path, "--seed", s) for s in ("1", "1", "2"))
    assert sorted(one) == list(range(TRAIN)) and one != sorted(one), "shuffle=(train_sampler is None)"
    assert one == again, "the same torch.manual_seed, the same order"
    assert one != two, "another torch.manual_seed, another order"
    assert _one_process(data, tmp_path) != _one_process(data, tmp_path), "unseeded runs differ"


@pytest.mark.slow
def test_imagenet_style_script_ten_runs_with_a_restart(data, tmp_path):
    """10 times: 3 epochs, then a new torchrun resuming from the checkpoint after epoch 2."""
    for run in range(10):
        where = tmp_path / str(run)
        where.mkdir()
        whole = [r[0] for r in _torchrun(where, data, "--epochs", "3", "--seed", str(run))]
        _check_shards(whole, range(3))
        _check_validation(whole, range(3))
        resumed = [r[0] for r in _torchrun(where, data, "--epochs", "3", "--seed", str(run), "--resume",
                                           str(where / "checkpoint.2.pth.tar"))]
        for w, r in zip(whole, resumed):
            assert r["train"]["2"] == w["train"]["2"] and r["crops"]["2"] == w["crops"]["2"]
