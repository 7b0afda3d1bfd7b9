"""GPU decode's batched row step (fastload/device/gpudecode/rows.py): each decoded image's box
resized (antialiased bilinear), windowed, flipped and rounded into its batch row.

The Triton kernel runs here in Triton's interpreter, on CPU tensors (the tests marked triton
skip without Triton), against ``F.interpolate(..., antialias=True)`` in float32 rounded
once, computed in this file: the kernel follows PyTorch's CUDA kernel, whose float32 sums
may round differently from the CPU's by a last bit, so a pixel may differ by a level, rarely.
The interpreter is slow (about 2 ms per filter tap of a program): sizes stay small.
"""

import io
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from fastload.device.gpudecode import rows

from conftest import photo_jpegs

OUT = (12, 10)  # (H, W) of every row: not square, so a swapped axis shows


def _photos():
    """Real photos (scikit-image's), shorter side 150-200: room for a 12x box."""
    return [np.array(Image.open(io.BytesIO(b)).convert("RGB")) for b in photo_jpegs((150, 200), 1, seed=3)[:6]]


def _plan(shapes, rng):
    """Boxes, resizes, windows, flips for images of ``shapes``: per axis a scale of the box
    over the resize from 12x down to 2x up (the first rows pin the ends), a random window."""
    scales = [(12.0, 2.0), (1.0, 1.0), (0.5, 0.6), (3.3, 7.1), (1.7, 0.8), (5.0, 1.2)]
    boxes, resize, windows = [], [], []
    for i, (h, w) in enumerate(shapes):
        sy, sx = scales[i] if i < len(scales) else rng.uniform(0.5, 12.0, 2)
        rh, rw = OUT[0] + int(rng.integers(0, 4)), OUT[1] + int(rng.integers(0, 4))
        bh, bw = min(h, max(1, round(rh * sy))), min(w, max(1, round(rw * sx)))
        y0, x0 = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        boxes.append((y0, x0, y0 + bh, x0 + bw))
        resize.append((rh, rw))
        windows.append((int(rng.integers(0, rh - OUT[0] + 1)), int(rng.integers(0, rw - OUT[1] + 1))))
    flips = np.arange(len(shapes)) % 2 == 0
    return np.array(boxes), np.array(resize), np.array(windows), flips


def _expected(img, box, size, window, flip, out=OUT):
    """One row as the float math makes it: F.interpolate in float32, window, flip, round."""
    y0, x0, y1, x1 = box
    x = torch.from_numpy(np.ascontiguousarray(img[y0:y1, x0:x1])).permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=tuple(int(v) for v in size), mode="bilinear", antialias=True, align_corners=False)
    top, left = window
    x = x[0, :, top : top + out[0], left : left + out[1]]
    return (x.flip(-1) if flip else x).round().clamp(0, 255).to(torch.uint8)


def _batch(n, out=OUT):
    """A batch whose every pixel is 77 (rows the step must not touch stay so)."""
    return torch.full((n, 3, *out), 77, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)


@pytest.fixture(scope="module")
def case():
    """Real photos, one a region's view of a larger decode (lines apart), planned into
    rows 1..R of a batch of R + 2 in a shuffled order; rows 0 and R + 1 are not in the table."""
    rng = np.random.default_rng(0)
    photos = _photos()
    images = [torch.from_numpy(p) for p in photos]
    images[2] = images[2][5:-3, 7:-4]  # a view: line pitch of the whole image
    boxes, resize, windows, flips = _plan([tuple(t.shape[:2]) for t in images], rng)
    dest = rng.permutation(len(images)) + 1
    want = _batch(len(images) + 2)
    for r, img in enumerate(images):
        want[dest[r]] = _expected(img.numpy(), boxes[r], resize[r], windows[r], flips[r])
    return images, (boxes, resize, windows, flips, dest), want


@pytest.fixture(scope="module")
def kernel_out(case):
    images, table, want = case
    if not rows.triton_available():
        pytest.skip("needs Triton: pip install triton")
    out = _batch(len(want))
    rows.resize_rows(out, images, *table, method="triton")
    return out


@pytest.mark.triton
def test_the_kernel_is_the_float_interpolate_on_real_photos(case, kernel_out):
    _, (boxes, resize, _, flips, _), want = case
    scale = (boxes[:, 2:] - boxes[:, :2]) / resize
    assert scale.max() >= 11.5 and scale.min() <= 0.55 and flips.any() and not flips.all()  # the range asked
    diff = (kernel_out.int() - want.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() <= 0.05, diff.float().mean()
    assert torch.equal(kernel_out[0], want[0]) and torch.equal(kernel_out[-1], want[-1])  # not in the table
    assert kernel_out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.triton
def test_the_kernel_is_the_cpu_paths_uint8_resize_to_a_level(case, kernel_out):
    images, table, _ = case
    cpu = _batch(len(kernel_out))
    rows.resize_rows(cpu, images, *table, method="uint8")
    diff = (kernel_out.int() - cpu.int()).abs().float()
    assert diff.mean(dim=(1, 2, 3)).max() <= 1.0 and diff.max() <= 2


def test_the_float_reference_is_the_float_interpolate(case):
    images, table, want = case
    out = _batch(len(want))
    rows.resize_rows(out, images, *table, method="float")
    assert torch.equal(out, want)


def test_auto_on_the_cpu_is_the_cpu_paths_uint8_resize(case):
    images, table, want = case
    auto, cpu = _batch(len(want)), _batch(len(want))
    rows.resize_rows(auto, images, *table)
    rows.resize_rows(cpu, images, *table, method="uint8")
    assert torch.equal(auto, cpu) and rows.method_for(torch.device("cpu")) == "uint8"
    assert torch.equal(auto[0], want[0]) and not torch.equal(auto[1], want[0])


@pytest.mark.triton
def test_one_pixel_boxes_and_one_pixel_rows():
    """Degenerate spans: 1x1 boxes enlarged (every output pixel is that pixel), a box one
    pixel tall (every line the same), and an image shrunk to a 1x1 batch row (all its taps)."""
    rng = np.random.default_rng(1)
    img = torch.from_numpy(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8))
    boxes = np.array([[17, 11, 18, 12], [39, 0, 40, 30], [39, 29, 40, 30]])
    resize = np.array([OUT, [OUT[0], 30], [OUT[0] + 1, OUT[1] + 2]])
    windows = np.array([[0, 0], [0, 7], [1, 2]])
    flips, dest = np.array([False, True, True]), np.array([2, 0, 1])
    out = _batch(3)
    rows.resize_rows(out, [img, img, img], boxes, resize, windows, flips, dest, method="triton")
    assert torch.equal(out[2], img[17, 11].view(3, 1, 1).expand(3, *OUT))
    assert torch.equal(out[1], img[39, 29].view(3, 1, 1).expand(3, *OUT))
    want = _expected(img.numpy(), boxes[1], resize[1], windows[1], True)
    assert (out[0].int() - want.int()).abs().max() <= 1 and torch.equal(out[0], out[0][:, :1].expand(3, *OUT))
    small = img[3:9, 2:6]  # 6x4, lines apart: 13x9 taps into one pixel
    one = _batch(2, (1, 1))
    table = (np.array([[0, 0, 6, 4]]), np.array([[1, 1]]), np.array([[0, 0]]), np.array([True]), np.array([1]))
    rows.resize_rows(one, [small], *table, method="triton")
    want = _expected(small.numpy(), [0, 0, 6, 4], (1, 1), (0, 0), True, out=(1, 1))
    assert (one[1].int() - want.int()).abs().max() <= 1 and torch.equal(one[0], _batch(1, (1, 1))[0])


@pytest.mark.triton
def test_ties_round_half_to_even():
    """An exact 2x enlargement: weights of quarters, sums exact in float32, and many of them
    halfway between two levels; torch.round takes the even one (2.5 -> 2, 3.5 -> 4)."""
    rng = np.random.default_rng(2)
    img = torch.from_numpy(rng.integers(0, 256, (OUT[0] // 2, OUT[1] // 2, 3), dtype=np.uint8))
    table = (np.array([[0, 0, *img.shape[:2]]]), np.array([OUT]), np.array([[0, 0]]), np.array([False]), np.array([0]))
    out = _batch(1)
    rows.resize_rows(out, [img], *table, method="triton")
    x = F.interpolate(img.permute(2, 0, 1)[None].float(), size=OUT, mode="bilinear", antialias=True)
    assert ((x - x.floor()) == 0.5).sum() >= 20  # ties to break
    assert torch.equal(out[0], _expected(img.numpy(), table[0][0], OUT, (0, 0), False))


def test_tables_that_do_not_fit_are_refused():
    img = torch.zeros((20, 30, 3), dtype=torch.uint8)
    ok = dict(boxes=np.array([[0, 0, 20, 30]]), resize=np.array([OUT]), windows=np.array([[0, 0]]),
              flips=np.array([False]), dest=np.array([0]))
    with pytest.raises(ValueError, match="box .* is not inside its"):
        rows.resize_rows(_batch(1), [img], **{**ok, "boxes": np.array([[0, 0, 21, 30]])}, method="float")
    with pytest.raises(ValueError, match="window at .* is not inside the resize"):
        rows.resize_rows(_batch(1), [img], **{**ok, "windows": np.array([[1, 0]])}, method="float")
    with pytest.raises(ValueError, match="one table row per image"):
        rows.resize_rows(_batch(1), [img, img], **ok, method="float")
    with pytest.raises(ValueError, match="channels_last"):
        rows.resize_rows(torch.zeros((1, 3, *OUT), dtype=torch.uint8), [img], **ok)
    with pytest.raises(ValueError, match="H×W×3 uint8"):
        rows.resize_rows(_batch(1), [img.float()], **ok, method="float")
    with pytest.raises(ValueError, match="not on out's device"):
        rows.resize_rows(_batch(1), [img.to("meta")], **ok, method="float")
    with pytest.raises(ValueError, match="method must be one of"):
        rows.resize_rows(_batch(1), [img], **ok, method="bicubic")


def test_without_triton_the_kernel_names_its_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "fastload.device.gpudecode.rowkernel", None)
    with pytest.raises(ImportError, match="pip install triton"):
        rows.kernel(interpret=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_the_compiled_kernel_is_the_float_interpolate_on_a_real_batch():
    """The compiled kernel on the GPU, a batch as GPU decode makes it (256 rows, 224 x 224,
    RandomResizedCrop boxes of real photos 2-7x larger than the output, one in two flipped,
    a region's view among them), against the float reference run on the same device."""
    if not rows.triton_available():
        pytest.skip("needs Triton: pip install triton")
    rng = np.random.default_rng(1)
    photos = [torch.from_numpy(np.array(Image.open(io.BytesIO(b)).convert("RGB")))
              for b in photo_jpegs((480, 640), 1, seed=5)[:8]]
    n, out = 256, (224, 224)
    images = [photos[i % len(photos)].cuda() for i in range(n)]
    images[3] = images[3][11:-7, 5:-9]  # a view with the whole image's line pitch
    boxes, resize, windows = [], [], []
    for img in images:
        h, w = img.shape[:2]
        bh, bw = int(rng.integers(min(h, 80), h + 1)), int(rng.integers(min(w, 80), w + 1))
        y0, x0 = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        boxes.append((y0, x0, y0 + bh, x0 + bw))
        resize.append(out)
        windows.append((0, 0))
    table = (np.array(boxes), np.array(resize), np.array(windows), np.arange(n) % 2 == 0, rng.permutation(n))
    got = torch.zeros((n, 3, *out), dtype=torch.uint8, device="cuda").contiguous(memory_format=torch.channels_last)
    want = got.clone()
    rows.resize_rows(got, images, *table, method="triton")
    rows.resize_rows(want, images, *table, method="float")
    diff = (got.int() - want.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() <= 0.05, (diff.max(), diff.float().mean())
