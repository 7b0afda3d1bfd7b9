"""decode="gpu" over streams (TFRecordStream, WebDataset): the slots pack their records for the
device as an indexed dataset's workers do, and the device builds the rows its decoder refuses
from the bytes the batch carries (a stream cannot read a record twice).

On this CPU machine the executor runs with nvImageCodec's CPU backend and torch on the CPU
(FASTLOAD_GPU_DECODE_ON_CPU=1): with ``reduced_decode=False`` its pixels are the CPU path's,
exactly (as tests/test_gpu_decode.py compares an indexed dataset's).
"""

import io
import os
import tarfile

import pytest
import torch
from conftest import jpeg_bytes, make_image, png_bytes
from PIL import Image

import fastload as fl
from fastload.decode import roi
from fastload.device.gpudecode.refused import neighbour_rows
from fastload.views import map_images

pytestmark = pytest.mark.skipif(not roi.available(), reason="GPU decode needs nvImageCodec: fastload[roi]")

KINDS = ["tfrecord", "wds"]
# Where the format is beside the point (the device's holes, refusals, neighbours): WebDataset's
# cases run in make test, TFRecord's with the slow ones (make test stays under 4 minutes).
KINDS_WDS_FIRST = [pytest.param("tfrecord", marks=pytest.mark.slow), "wds"]
RUNNERS = {"in-process": dict(num_workers=0), "threads": dict(num_workers=2, backend="thread"),
           "processes": dict(num_workers=2, backend="process")}


@pytest.fixture(autouse=True)
def _on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # WebDataset's index cache


def _photos(n):
    return [jpeg_bytes(make_image(i, 140 + 9 * i, 190 + 7 * i)) for i in range(n)]


def _odd_ones():
    """What the GPU decoder does not get (a PNG, a CMYK JPEG, a progressive JPEG), and a grey JPEG, which it does."""
    img = make_image(99, 150, 210)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90, progressive=True)
    return [png_bytes(Image.fromarray(img)), jpeg_bytes(img, mode="CMYK"), buf.getvalue(), jpeg_bytes(img, mode="L")]


def _corrupt(data: bytes) -> bytes:
    """Zeros over part of the scan: the header and the end are whole (the worker packs it for
    the GPU), a strict decode refuses it."""
    mid = len(data) // 2
    return data[:mid] + bytes(400) + data[mid + 400 :]


def _stream(kind, root, images, tf):
    """A stream of ``images`` (record k: label k % 3) in two files."""
    os.makedirs(root, exist_ok=True)
    half = len(images) // 2
    parts = [list(enumerate(images))[:half], list(enumerate(images))[half:]]
    if kind == "tfrecord":
        pytest.importorskip("tfrecord")
        pytest.importorskip("crc32c")
        from tfrecord_files import example, framed

        paths = []
        for p, part in enumerate(parts):
            paths.append(os.path.join(root, f"part-{p:05d}-of-00002"))
            with open(paths[-1], "wb") as f:
                f.write(b"".join(framed(example(data, k % 3)) for k, data in part))
        return fl.TFRecordStream(paths, transform=tf)
    for p, part in enumerate(parts):
        with tarfile.open(os.path.join(root, f"shard-{p:06d}.tar"), "w") as t:
            for k, data in part:
                for name, value in ((f"s{k:05d}.jpg", data), (f"s{k:05d}.cls", str(k % 3).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(value)
                    t.addfile(info, io.BytesIO(value))
    return fl.WebDataset(str(root), transform=tf)


def _batches(ds, decode, epochs=(0, 1), **kw):
    opts = dict(batch_size=4, num_workers=0, device="cpu", normalize=False, return_index=True, seed=3)
    opts.update(kw)
    out = []
    with fl.Loader(ds, decode=decode, **opts) as loader:
        for epoch in epochs:
            loader.set_epoch(epoch)
            out += [tuple(map_images(torch.clone, t) for t in b) for b in loader]  # views: a tuple of clones
        return out, loader.stats(), [s.index for s in loader.skipped]


def _assert_same(a, b):
    """Every batch equal: pixels, targets and indices (the pixels exactly: see the module's docstring)."""
    assert len(a) == len(b)
    for (xa, ya, ia), (xb, yb, ib) in zip(a, b):
        assert torch.equal(ia, ib) and torch.equal(ya, yb), (ia, ib)
        assert torch.equal(xa, xb), ia


@pytest.mark.parametrize("runner", [pytest.param(r, marks=[pytest.mark.slow] if r == "processes" else [])
                                    for r in RUNNERS])
@pytest.mark.parametrize("kind", KINDS)
def test_a_streams_batches_on_the_gpu_are_the_cpu_paths(tmp_path, kind, runner):
    ds = _stream(kind, tmp_path / kind, _photos(10) + _odd_ones(), fl.transforms.train(48, reduced_decode=False))
    gpu, stats, _ = _batches(ds, "gpu", **RUNNERS[runner])
    cpu, _, _ = _batches(ds, "cpu", **RUNNERS[runner])
    _assert_same(gpu, cpu)
    assert stats["gpu_decoded_rows"] > 0 and stats["cpu_fallback_rows"] == 0


@pytest.mark.parametrize("kind", KINDS_WDS_FIRST)
def test_rows_the_decoder_refuses_are_planned_again_from_their_bytes(tmp_path, kind, refuse, monkeypatch):
    ds = _stream(kind, tmp_path / kind, _photos(10), fl.transforms.train(48, reduced_decode=False))
    reads = []
    record_bytes = type(ds).record_bytes
    monkeypatch.setattr(type(ds), "record_bytes", lambda self, record: reads.append(record.number)
                        or record_bytes(self, record))
    refuse.update({1, 2})
    gpu, stats, _ = _batches(ds, "gpu", gpu_cpu_share=0)  # every row to the decoder
    assert sorted(reads) == sorted(2 * list(range(10)))  # each record read once per epoch, in its slot
    cpu, _, _ = _batches(ds, "cpu")
    _assert_same(gpu, cpu)
    assert stats["cpu_fallback_rows"] == 2 * (2 + 2 + 1)  # rows 1 and 2 of batches of 4, 4 and 2; two epochs


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("kind", KINDS_WDS_FIRST)
def test_a_damaged_record_the_decoder_refuses_is_the_cpu_paths_error(tmp_path, kind, refuse, on_error):
    """Record 6 decodes on the GPU (not strict) but not on the CPU: refused, its row's CPU
    build meets the error, named as the worker names the record; under "skip" its row is its
    neighbour's (record 5, the row before it; not the batch's first), as decode="cpu" fills it."""
    images = _photos(10)
    images[6] = _corrupt(images[6])
    ds = _stream(kind, tmp_path / kind, images, fl.transforms.train(48, reduced_decode=False))
    refuse.update(range(4))  # every row
    if on_error == "raise":
        where = "part-00001-of-00002" if kind == "tfrecord" else "shard-000001.tar sample 's00006'"
        with pytest.raises(fl.SampleError, match=f"record 6 .*{where}") as raised:
            _batches(ds, "gpu", epochs=(0,), gpu_cpu_share=0)
        assert raised.value.index == 6
        return
    with pytest.warns(RuntimeWarning, match="skipped"):
        gpu, stats, skipped = _batches(ds, "gpu", gpu_cpu_share=0, on_error="skip")
        cpu, _, cpu_skipped = _batches(ds, "cpu", on_error="skip")
    assert skipped == cpu_skipped == [6, 6]  # once per epoch
    assert sum(len(i) for _, _, i in gpu) == 20 and [[4, 5, 5, 7]] * 2 == [i.tolist() for _, _, i in gpu[1::3]]
    _assert_same(gpu, cpu)


@pytest.mark.parametrize("kind", KINDS_WDS_FIRST)
def test_records_that_fail_in_the_worker_are_holes_the_device_fills(tmp_path, kind):
    """Cut short, record 0 (first of its batch) and record 6 (third) fail in the slot's CPU
    rows; the device fills each from its batch's good rows as a slot's neighbours do (record
    1, the first good one after it; record 5, the last good one before it, a GPU row). Record
    7, a PNG, is a CPU row beside record 6 that does not fail."""
    images = _photos(10)
    for k in (0, 6):
        images[k] = images[k][: len(images[k]) // 2]
    images[7] = _odd_ones()[0]
    ds = _stream(kind, tmp_path / kind, images, fl.transforms.train(48, reduced_decode=False))
    with pytest.warns(RuntimeWarning, match="skipped"):
        gpu, stats, skipped = _batches(ds, "gpu", epochs=(0,), gpu_cpu_share=0, on_error="skip")
        cpu, _, cpu_skipped = _batches(ds, "cpu", epochs=(0,), on_error="skip")
    assert skipped == cpu_skipped == [0, 6] and stats["cpu_fallback_rows"] == 0
    assert [i.tolist() for _, _, i in gpu] == [[1, 1, 2, 3], [4, 5, 5, 7], [8, 9]]
    _assert_same(gpu, cpu)


def test_a_hole_takes_the_last_good_row_before_it_else_the_first_after():
    assert neighbour_rows(5, [0, 1, 3]) == [2, 2, 2]
    assert neighbour_rows(4, [2, 3]) == [1, 1]
    assert neighbour_rows(3, [0, 1, 2]) is None


@pytest.mark.parametrize("last", ["gpu-rows", "cpu-rows"])
@pytest.mark.parametrize("kind", KINDS_WDS_FIRST)
def test_a_failed_record_no_good_row_precedes_takes_the_slots_last_good_record(tmp_path, kind, last):
    """Cut short: records 0-3 (the first batch: owed until record 4, the slot's first good
    record, pays it), 8 (first of its batch: record 7, the slot's last good record, the batch
    before's) and 12-15 (a whole batch: record 11), as decode="cpu" fills them. Records 4, 7
    and 11 are rows the GPU decodes (a copy of the packed row is decoded again) or PNGs the
    CPU path decodes (their pixels are kept)."""
    images = _photos(16)
    for k in (0, 1, 2, 3, 8, 12, 13, 14, 15):
        images[k] = images[k][: len(images[k]) // 2]
    if last == "cpu-rows":
        for k in (4, 7, 11):
            images[k] = png_bytes(Image.fromarray(make_image(k, 150, 200)))
    ds = _stream(kind, tmp_path / kind, images, fl.transforms.train(48, reduced_decode=False))
    with pytest.warns(RuntimeWarning, match="skipped"):
        gpu, stats, skipped = _batches(ds, "gpu", epochs=(0,), gpu_cpu_share=0, on_error="skip")
        cpu, _, cpu_skipped = _batches(ds, "cpu", epochs=(0,), on_error="skip")
    assert skipped == cpu_skipped == [0, 1, 2, 3, 8, 12, 13, 14, 15]
    assert [i.tolist() for _, _, i in gpu] == [[4] * 4, [4, 5, 6, 7], [7, 9, 10, 11], [11] * 4]
    _assert_same(gpu, cpu)


@pytest.mark.parametrize("runner", ["in-process", "threads"])
def test_a_streams_slots_decode_the_cpu_share_they_start_with(tmp_path, runner):
    """gpu_cpu_share reaches a stream's slots as each pass starts: with 1 every GPU-decodable
    row is decoded by the CPU path in the slots (the same pixels), none on the device."""
    ds = _stream("wds", tmp_path / "wds", _photos(10), fl.transforms.train(48, reduced_decode=False))
    gpu, stats, _ = _batches(ds, "gpu", gpu_cpu_share=1.0, **RUNNERS[runner])
    cpu, _, _ = _batches(ds, "cpu", **RUNNERS[runner])
    _assert_same(gpu, cpu)
    assert stats["gpu_decoded_rows"] == 0 and stats["cpu_share_rows"] == 20
