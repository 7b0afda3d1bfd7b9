"""The scripts in examples/ run as a user runs them, on tiny data on the CPU: the ImageNet
example under torchrun on 2 ranks (then resumed from its checkpoint), the Lightning module
under torchrun with DDP, and the WebDataset-over-HTTP example. Slow (torchrun starts): run by
``make test-slow`` in CI."""

import os
import re
import subprocess
import sys

import pytest
from conftest import write_folder
from torchrun import failure, torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples_data")
    write_folder(root / "train", num_classes=3, per_class=6, size=(40, 48))
    write_folder(root / "val", num_classes=3, per_class=3, size=(40, 48), seed=1)  # 9: not a multiple of 2 ranks
    return str(root)


def _run(cwd, script, *args, ranks=1, timeout=300):
    """stdout + stderr of ``python examples/SCRIPT ARGS`` (under torchrun with ``ranks`` > 1)."""
    argv = [os.path.join(HERE, "run_example.py"), os.path.join(EXAMPLES, script), *map(str, args)]
    env = {**os.environ, "FASTLOAD_NO_CALIBRATION": "1"}
    if ranks > 1:
        proc = torchrun(*argv, ranks=ranks, timeout=timeout, env=env, cwd=cwd)
    else:
        env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=cwd)
        assert proc.returncode == 0, failure(proc)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, failure(proc)
    return out


def test_imagenet_example_ddp_and_resume(data, tmp_path):
    common = [data, "-a", "tiny", "-b", "4", "-j", "1", "--image-size", "32", "--checkpoint-dir", tmp_path]
    first = _run(tmp_path, "imagenet/main.py", *common, "--epochs", "2", "--seed", "0", ranks=2)
    # 9 train samples per rank at batch 4: 3 batches per rank and epoch; both epochs ran.
    assert first.count("Epoch [0][0/3]") == 2 and first.count("Epoch [1][0/3]") == 2, first[-3000:]
    # Every validation counts all 9 images: 8 through the DistributedSampler, 1 through the
    # auxiliary loader with sampler=None on each rank.
    assert len(re.findall(r"Acc@1 [\d.]+ Loss [\d.]+ \(9 images\)", first)) == 4, first[-3000:]
    assert os.path.exists(tmp_path / "checkpoint.pth.tar")

    resumed = _run(
        tmp_path, "imagenet/main.py", *common, "--epochs", "3", "--resume", tmp_path / "checkpoint.pth.tar", ranks=2
    )
    assert resumed.count("(epoch 2)") == 2 and "Epoch [1]" not in resumed, resumed[-3000:]
    assert resumed.count("Epoch [2][0/3]") == 2, resumed[-3000:]


def test_imagenet_example_one_process_evaluate(data, tmp_path):
    out = _run(
        tmp_path,
        "imagenet/main.py",
        data,
        "-a",
        "tiny",
        "-b",
        "4",
        "-j",
        "1",
        "--image-size",
        "32",
        "--epochs",
        "1",
        "--checkpoint-dir",
        tmp_path,
    )
    assert "Epoch [0][0/5]" in out and "(9 images)" in out, out[-3000:]
    out = _run(
        tmp_path,
        "imagenet/main.py",
        data,
        "-a",
        "tiny",
        "-b",
        "4",
        "-j",
        "1",
        "--image-size",
        "32",
        "--resume",
        tmp_path / "checkpoint.pth.tar",
        "--evaluate",
    )
    assert "Epoch" not in out and "(9 images)" in out, out[-3000:]


def test_lightning_example_ddp(data, tmp_path):
    out = _run(
        tmp_path,
        "lightning_train.py",
        data,
        "--devices",
        "2",
        "-b",
        "4",
        "-j",
        "1",
        "--image-size",
        "32",
        "--out",
        tmp_path / "logs",
        ranks=2,
    )
    assert "Starting with 2 processes" in out, out[-3000:]
    # 18 samples, 2 ranks, batch 4: 3 steps per rank and epoch, 2 epochs: step 6 in the name.
    assert re.search(r"done: 2 epochs, val_acc [\d.]+, checkpoint .*epoch=1-step=6\.ckpt", out), out[-3000:]


def test_wds_http_example(data, tmp_path):
    out = _run(
        tmp_path,
        "wds_http_train.py",
        os.path.join(data, "train"),
        "--out",
        tmp_path,
        "--shard-samples",
        "5",
        "-b",
        "4",
        "-j",
        "2",
        "--image-size",
        "32",
        "--epochs",
        "2",
    )
    assert "converted 18 images into 4 shards" in out, out
    assert re.search(r"serving them at http://127\.0\.0\.1:\d+/shard-\{000000\.\.000003\}\.tar", out), out
    assert out.count("18 samples from HTTP") == 2, out
    assert len(os.listdir(tmp_path / "cache")) > 0  # read through the shard cache, i.e. from the server
