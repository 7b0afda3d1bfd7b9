"""The real clients: examples/timm_train.py and examples/torchvision_train.py under torchrun, 2 ranks, CPU.

Each runs its recipe's full argument set on a tiny folder for 2 epochs and records, per
rank and epoch, the dataset indices it trained on and whether its targets were soft: every
sample must be seen exactly once per epoch across the ranks, the order must change with
the epoch, every training step must get soft (mixed, smoothed) targets, and the batches reach
the model in its memory format. The evaluation split is ``val/``: timm's port finds it for its
default ``--val-split validation`` as timm does (a synonym).
"""

import importlib.util
import json
import math
import os

import pytest
from conftest import write_folder
from torchrun import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLASSES, PER_CLASS, BATCH = 3, 8, 4  # 24 images: 12 per rank, 3 batches of 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe_data")
    write_folder(str(root / "train"), CLASSES, PER_CLASS, seed=0)
    write_folder(str(root / "val"), CLASSES, 2, seed=1)  # torchvision's name; timm's default is validation
    return str(root)


RECIPES = {
    "timm": ["examples/timm_train.py", "{data}", "--img-size", "64", "--aa", "rand-m9-mstd0.5-inc1", "--reprob",
             "0.25", "--remode", "pixel", "--mixup", "0.8", "--cutmix", "1.0", "--smoothing", "0.1",
             "--color-jitter", "0.4"],
    "torchvision": ["examples/torchvision_train.py", "--data-path", "{data}", "--train-crop-size", "64",
                    "--val-resize-size", "72", "--val-crop-size", "64", "--auto-augment", "ta_wide",
                    "--random-erase", "0.1", "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0",
                    "--label-smoothing", "0.1"],
}


def _run(recipe: str, data: str, out: str, workers: int) -> list[dict]:
    script, *args = (a.format(data=data) for a in RECIPES[recipe])
    if not os.path.exists(os.path.join(ROOT, script)):
        pytest.skip(f"{script} is not there yet")
    torchrun(os.path.join(ROOT, script), *args, "-b", BATCH, "-j", workers, "--epochs", 2, "--device", "cpu",
             "--record", out, timeout=300, cwd=ROOT)
    return [json.loads(open(f"{out}.{r}.json").read()) for r in (0, 1)]


# timm's port with a worker under torchrun (7 s) with the slow tests; torchvision's stays in make test.
@pytest.mark.parametrize("recipe,workers", [pytest.param("timm", 1, marks=pytest.mark.slow), ("torchvision", 0)])
def test_recipe_trains_on_every_sample_once_per_epoch_with_soft_targets(tmp_path, data, recipe, workers):
    ranks = _run(recipe, data, str(tmp_path / "seen"), workers)
    n = CLASSES * PER_CLASS
    for epoch in ("0", "1"):
        seen = ranks[0][epoch]["seen"] + ranks[1][epoch]["seen"]
        assert sorted(seen) == list(range(n)), f"epoch {epoch}: every sample exactly once across the ranks"
        for r in ranks:
            steps = r[epoch]["steps"]
            assert steps == r[epoch]["batches"] == n // 2 // BATCH
            assert r[epoch]["soft_batches"] == steps, "every step gets soft targets"
            assert r[epoch]["target_shape"] == [BATCH, CLASSES]
            assert all(math.isfinite(v) for v in r[epoch]["losses"])
            assert r[epoch]["eval"]["total"] > 0
            # The Loader's batches are channels_last; the ports hand them over in the model's format.
            assert r[epoch]["input_channels_last"] == r[epoch]["model_channels_last"] is False
    assert ranks[0]["0"]["seen"] != ranks[0]["1"]["seen"], "set_epoch must reshuffle"
    # A batch of 4 pairs samples 0-3 and 1-2: over 12 batches some pair mixes two classes.
    assert sum(r[e]["mixed_batches"] for r in ranks for e in ("0", "1")) > 0


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timm_port_finds_a_split_by_its_synonyms_as_timm_does(tmp_path):
    timm_train = _example("timm_train")
    (tmp_path / "val").mkdir()
    (tmp_path / "training").mkdir()
    assert timm_train.split_folder(str(tmp_path), "validation") == str(tmp_path / "val")
    assert timm_train.split_folder(str(tmp_path), "train") == str(tmp_path / "training")
    (tmp_path / "validation").mkdir()  # the split's own name comes first
    assert timm_train.split_folder(str(tmp_path), "validation") == str(tmp_path / "validation")
    with pytest.raises(FileNotFoundError, match="no folder for split 'test' .* \\(tried test\\)"):
        timm_train.split_folder(str(tmp_path), "test")


@pytest.mark.parametrize("argv,message", [
    (["--backend", "bogus"], "backend can be 'tensor' or 'pil', but got bogus"),
    (["--cache-dataset"], "--cache-dataset: not needed with fastload"),
])
def test_torchvision_port_refuses_what_the_reference_refuses_or_fastload_cannot_honour(data, argv, message):
    torchvision_train = _example("torchvision_train")
    args = torchvision_train.get_args_parser().parse_args(["--data-path", data, *argv])
    with pytest.raises(ValueError, match=message):
        torchvision_train.load_data(os.path.join(data, "train"), os.path.join(data, "val"), args)
