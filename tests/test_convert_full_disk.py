"""Converters on a full disk: a named error with the space missing, exit status 3, nothing left behind."""

import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import jpeg_bytes, need_formats

from fastload.convert import NO_SPACE_EXIT, NoSpaceError, convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = {"lmdb": "folder2lmdb.py", "tfrecord": "folder2tfrecord.py", "wds": "folder2wds.py"}


@pytest.fixture(scope="module")
def noisy_folder(tmp_path_factory) -> str:
    """About 6 MB of noise JPEGs (noise does not compress): more than a 2 MB disk holds."""
    root = tmp_path_factory.mktemp("noisy")
    rng = np.random.default_rng(0)
    for c in range(2):
        os.makedirs(root / f"c{c}")
        for i in range(20):
            (root / f"c{c}" / f"{i:03d}.jpg").write_bytes(jpeg_bytes(rng.integers(0, 256, (384, 384, 3), np.uint8)))
    return str(root)


def _small_disk_run(mount: str, command: str) -> subprocess.CompletedProcess:
    """Runs ``command`` (a shell line) with a 2 MB tmpfs mounted on ``mount`` in a private mount namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=2m tmpfs {mount}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here (not root?): {probe.stderr.strip()}")
    line = f"mount -t tmpfs -o size=2m tmpfs {mount} && {{ {command}; rc=$?; echo LEFT:; ls -A {mount}; exit $rc; }}"
    return subprocess.run(["unshare", "-m", "sh", "-c", line], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord", "wds"])
def test_a_full_disk_is_named_with_its_own_exit_status_and_leaves_nothing(noisy_folder, tmp_path, fmt):
    if fmt != "wds":  # written by fastload itself
        need_formats(fmt)
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = _small_disk_run(str(mount), f"{sys.executable} {os.path.join(ROOT, 'tools', TOOLS[fmt])} "
                                       f"{noisy_folder} {mount}/out --workers 1")
    assert proc.returncode == NO_SPACE_EXIT, proc.stdout + proc.stderr
    message = next((line for line in proc.stderr.splitlines() if "error:" in line), "")
    assert f"no space left on {mount}/out (needs about " in message and " MB more" in message, proc.stderr
    needed = int(message.split("needs about ")[1].split(" MB")[0])
    assert 2 <= needed <= 12, message  # ~6 MB of images on a 2 MB disk
    assert "Traceback" not in proc.stderr
    assert proc.stdout.split("LEFT:")[1].split() == [], "the partial output was left on the disk"


def test_help_documents_the_exit_status():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "folder2wds.py"), "--help"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}).stdout
    assert f"{NO_SPACE_EXIT} no space left on DST" in " ".join(out.split())


@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_enospc_from_a_write_is_a_no_space_error(noisy_folder, tmp_path, monkeypatch, fmt):
    """Without a small disk: writes into the partial output fail with ENOSPC after the 12th (closes too)."""
    if fmt != "wds":  # written by fastload itself
        need_formats(fmt)
    import io

    writes = {"n": 0}

    class Full(io.FileIO):
        def write(self, b):
            writes["n"] += 1
            if writes["n"] > 12:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(b)

    real_open = open

    def fake_open(path, mode="r", *a, **k):
        if "b" in mode and "w" in mode and ".partial-" in str(path):
            return io.BufferedWriter(Full(path, "wb"), buffer_size=1)
        return real_open(path, mode, *a, **k)

    import builtins
    import tarfile

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(tarfile, "bltn_open", fake_open, raising=False)
    dst = str(tmp_path / "out")
    with pytest.raises(NoSpaceError, match=r"no space left on .*out \(needs about \d+ MB more") as info:
        convert(noisy_folder, dst, fmt, progress=False, workers=1)
    assert info.value.errno == errno.ENOSPC and info.value.needed > 0
    assert sorted(os.listdir(tmp_path)) == [], "the partial output was left behind"
