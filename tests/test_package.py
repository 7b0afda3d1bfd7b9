"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel; the wheel
holds the package and its ``py.typed``, not the tests or benchmarks, with the project's
metadata; installed into a clean venv (no dev extras; pinned by constraints.txt) it runs
``fastload --version``, ``fastload info``, a ten-line Loader over a small folder, and
``fastload demo`` once scikit-image's photographs are added as ``make demo`` adds them.
Slow (a venv with torch): ``make test-slow`` runs it in CI after ``make test``."""

import os
import re
import subprocess
import sys
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
pytestmark = pytest.mark.slow

USER_SCRIPT = """
import os, numpy as np
from PIL import Image
import fastload as fl
for c in range(2):
    os.makedirs(f"folder/c{c}", exist_ok=True)
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (48, 64, 3), np.uint8)).save(f"folder/c{c}/{i}.jpg")
with fl.Loader(fl.ImageFolder("folder", transform=fl.transforms.train(32)), batch_size=4, num_workers=2) as loader:
    shapes = [tuple(x.shape) for x, y in loader]
print("loaded", fl.__file__, shapes)
"""


def _run(cmd, cwd, timeout=900):
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """sdist + wheel built from the tracked files (a clean checkout, not this work tree's leftovers)."""
    pytest.importorskip("build", reason="the build extra is not installed: make test installs it")
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    with subprocess.Popen(
        ["tar", "-cf", "-", "--null", "-T", "-"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as tar:
        archive, _ = tar.communicate(files)
    subprocess.run(["tar", "-xf", "-"], cwd=src, input=archive, check=True)
    out = src / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(out)], cwd=src)
    return out


def test_build_makes_an_sdist_and_a_typed_wheel_without_tests(dist):
    wheels, sdists = list(dist.glob("fastload-*.whl")), list(dist.glob("fastload-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, os.listdir(dist)
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "fastload/py.typed" in names
    assert "fastload/__init__.py" in names and "fastload/transforms/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/", "docs/", "tools/"))]
    assert "fastload = fastload.cli:main" in entry
    assert "Project-URL: Documentation" in meta and "Project-URL: Changelog" in meta
    assert "Classifier: Typing :: Typed" in meta and "Requires-Python: >=3.9" in meta
    assert not re.search(r"Requires-Dist: (pytest|lightning|mkdocs|ruff)\b(?!.*extra ==)", meta)


def test_wheel_installs_and_runs_in_a_clean_venv(dist, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    wheel = next(dist.glob("fastload-*.whl"))
    _run([str(py), "-m", "pip", "install", "-q", "-c", os.path.join(ROOT, "constraints.txt"), str(wheel)], cwd=tmp_path)
    freeze = _run([str(py), "-m", "pip", "freeze"], cwd=tmp_path)
    assert "torch==" in freeze and not re.search(r"^(pytest|lightning|mkdocs)==", freeze, re.M), freeze

    version = _run([str(venv / "bin" / "fastload"), "--version"], cwd=tmp_path)
    assert version.strip() == "fastload 0.1.0", version
    info = _run([str(venv / "bin" / "fastload"), "info"], cwd=tmp_path)
    assert "default decoder:" in info and "decoder simplejpeg: ok" in info, info

    (tmp_path / "user.py").write_text(USER_SCRIPT)
    out = _run([str(py), "user.py"], cwd=tmp_path)
    assert f"loaded {venv}" in out, out  # the installed copy, not the work tree
    assert "[(4, 3, 32, 32), (4, 3, 32, 32), (4, 3, 32, 32)]" in out, out

    # What make demo installs besides the package: scikit-image's photographs, without its
    # dependencies. The demo runs on that alone (issue 32, item 22: make test adds the rest).
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-c", os.path.join(ROOT, "constraints.txt"),
          "scikit-image"], cwd=tmp_path)
    demo = _run([str(venv / "bin" / "fastload"), "demo", "--data", "demo", "--images", "130"], cwd=tmp_path)
    assert "converted to tfrecord" in demo and "* chosen:" in demo, demo[-3000:]
