import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.photos.jpegs import photo_like

_TESTS = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_TESTS)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _triton_skip():
    from fastload.device.gpudecode.rows import triton_available

    return pytest.mark.skipif(
        not triton_available(), reason="needs Triton (its interpreter runs the kernel on the CPU): pip install triton"
    )

# The packages each dataset format needs: optional where fastload is used (lazily imported),
# maybe absent where the suite runs (the GPU machine gets them as carried wheels).
FORMAT_PACKAGES = {"lmdb": ("lmdb",), "tfrecord": ("tfrecord", "crc32c")}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(cuda)
        if "triton" in item.keywords:
            item.add_marker(_triton_skip())


@pytest.fixture
def sim(monkeypatch, request):
    """Simulated GPUs for this test: the CUDA stream simulator of tests/cudasim."""
    from cudasim import simulated

    yield from simulated(monkeypatch, request)


def device_memory_per_epoch(loader, epochs: int) -> list[tuple[int, int]]:
    """(in use, reserved) device memory after each of ``epochs`` passes over ``loader``:
    in use as the driver counts it (``mem_get_info``: torch's allocator and what libraries
    such as nvImageCodec hold outside it), reserved as torch's allocator does."""
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        out.append((total - free, torch.cuda.memory_reserved()))
    return out


def uss_mb(pid: int | str = "self") -> float:
    """USS of process ``pid`` in MiB: the pages no other process maps (/proc/PID/smaps_rollup)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Private")) / 1024


def children() -> set[int]:
    """Live child processes of this one (earlier tests may leave some behind: compare sets)."""
    me, pids = str(os.getpid()), set()
    for stat in os.listdir("/proc"):
        if not stat.isdigit():
            continue
        try:
            with open(f"/proc/{stat}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            pids.add(int(stat))
    return pids


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs"):
        need_formats(*mark.args)
    for mark in item.iter_markers("decoder"):
        need_decoder(*mark.args)


def need_decoder(name: str):
    """The decoder backend ``name``, or a skip of the calling test that says why it cannot
    load here (``@pytest.mark.decoder("turbojpeg")`` does the same for a whole test).

    The system libturbojpeg is optional (a fresh machine and the GPU machines have none),
    so tests of the ``turbojpeg`` backend itself skip without it; the skip reason carries
    the loader's own message, which names the package to install.
    """
    from fastload.decode import get_decoder

    try:
        return get_decoder(name)
    except ImportError as e:
        pytest.skip(f"needs decoder backend {name!r}: {e}")


def need_formats(*formats: str) -> None:
    """Skips the calling test unless the packages of every format in ``formats`` import
    (``@pytest.mark.needs("lmdb", ...)`` does the same for a whole test or module)."""
    for fmt in formats:
        for module in FORMAT_PACKAGES.get(fmt, (fmt,)):
            pytest.importorskip(module, reason=f"{fmt} tests need the {module} package")


def jpeg_bytes(img: np.ndarray, quality: int = 92, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    pil = Image.fromarray(img)
    if mode:
        pil = pil.convert(mode)
    pil.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _scan_start(data: bytes) -> int:
    """Offset of the first entropy-coded byte: just after the first SOS segment."""
    i = 2
    while data[i + 1] != 0xDA:
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return i + 2 + int.from_bytes(data[i + 2 : i + 4], "big")


def flip_scan_bytes(data: bytes, seed: int) -> bytes:
    """``data`` with 1-3 random bytes of its entropy-coded data changed."""
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    for pos in rng.integers(_scan_start(data), len(data) - 2, size=int(rng.integers(1, 4))):
        out[pos] ^= int(rng.integers(1, 256))
    return bytes(out)


def png_bytes(pil: Image.Image) -> bytes:
    buf = io.BytesIO()
    pil.save(buf, format="PNG")
    return buf.getvalue()


def make_image(seed: int, h: int = 120, w: int = 160) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return photo_like(rng, h, w, rng.uniform(-1, 1, 3))


def write_folder(root, num_classes: int = 3, per_class: int = 8, size=(96, 128), seed: int = 0) -> str:
    """root/<class>/<i>.jpg with varied sizes around ``size``; returns root."""
    root = str(root)
    for c in range(num_classes):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
        for i in range(per_class):
            k = seed * 10_000 + c * 1000 + i
            h = size[0] + (k * 7) % 40
            w = size[1] + (k * 13) % 50
            with open(os.path.join(root, f"c{c}", f"{i:03d}.jpg"), "wb") as f:
                f.write(jpeg_bytes(make_image(k, h, w)))
    return root


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> str:
    return write_folder(tmp_path_factory.mktemp("folder"))


def photo_jpegs(short_sides: tuple[int, int], per_photo: int, seed: int, originals: bool = False) -> list[bytes]:
    """Deterministic rescalings of the bundled real photos to shorter sides in
    ``short_sides`` (and the originals in that range, with ``originals``), as JPEG of
    quality 75-95, odd sizes included. Skips the test without scikit-image's photos."""
    from fastload.photos.bundled import source_photos

    try:
        photos = source_photos()
    except ImportError as e:
        pytest.skip(str(e))
    rng = np.random.default_rng(seed)
    out = []
    for img in photos.values():
        keep = originals and short_sides[0] <= min(img.shape[:2]) <= short_sides[1]
        variants = [img] if keep else []
        for _ in range(per_photo):
            s = int(rng.integers(short_sides[0], short_sides[1] + 1)) / min(img.shape[:2])
            size = (max(1, round(img.shape[1] * s)), max(1, round(img.shape[0] * s)))
            variants.append(np.asarray(Image.fromarray(img).resize(size, Image.Resampling.LANCZOS)))
        out += [jpeg_bytes(v, quality=int(rng.integers(75, 96))) for v in variants]
    return out


def run_with_private_shm(code: str, size: str = "1g", timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs Python ``code`` in a child process that has a /dev/shm of its own (a tmpfs of
    ``size`` in a private mount namespace): what it finds there is only what fastload left,
    other tests and programs cannot add to it, and its size is that of a container's
    (Docker: 64m). Skips the calling test where a mount namespace cannot be made (needs root)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("a private /dev/shm needs unshare -m (root, or a container that allows mount namespaces)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_REPO, _TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$0" -c "$1"',
                           sys.executable, code], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def nvimgcodec_regions(monkeypatch):
    """Region decodes through nvImageCodec's CPU backend, as on a machine without a system
    libturbojpeg >= 3.0 (fastload.decode.roi_turbo, which roi.get_region_decoder takes first):
    for tests of nvImageCodec's own behaviour (its batched call, its missing-library message)."""
    from fastload.decode import roi, roi_turbo

    monkeypatch.setattr(roi_turbo, "_checked", False)
    monkeypatch.setattr(roi, "_decoder", None)


@pytest.fixture
def refuse(monkeypatch):
    """GPU decode's decoder refuses the images whose batch rows are in the returned set (the
    CPU path then builds them: the GPU decode tests' refused rows)."""
    from fastload.device.gpudecode import nvdecode

    rows: set[int] = set()
    decode = nvdecode.BatchDecoder.decode

    def refusing(self, batch, cuda_stream=0):
        tensors, keep = decode(self, batch, cuda_stream)
        return [None if int(batch.rows[r]) in rows else t for r, t in enumerate(tensors)], keep

    monkeypatch.setattr(nvdecode.BatchDecoder, "decode", refusing)
    return rows
