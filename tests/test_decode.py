import math
import warnings

import numpy as np
import pytest
from PIL import Image

from fastload import decode as dec
from fastload.decode import BACKENDS, DecodeError, decode_image, get_decoder, image_size

from conftest import jpeg_bytes, make_image, png_bytes

ALL = [b for b in BACKENDS if b != "turbojpeg" or dec._available("turbojpeg")]


@pytest.fixture(scope="module")
def photo():
    return make_image(1, 181, 243)  # odd sizes exercise DCT rounding


@pytest.mark.parametrize("backend", ALL)
def test_backends_agree_on_jpeg(photo, backend):
    data = jpeg_bytes(photo, quality=95)
    ref = decode_image(data, backend="pillow").astype(np.int16)
    out = decode_image(data, backend=backend)
    assert out.dtype == np.uint8 and out.shape == (181, 243, 3)
    assert np.abs(out.astype(np.int16) - ref).mean() < 1.5  # IDCT / upsampling differences only
    assert np.abs(out.astype(np.int16) - photo).mean() < 8  # lossy 4:2:0, but RGB order right


@pytest.mark.parametrize("backend", ALL)
def test_grayscale_jpeg_becomes_rgb(photo, backend):
    out = decode_image(jpeg_bytes(photo, mode="L"), backend=backend)
    assert out.shape == (181, 243, 3)
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])


@pytest.mark.parametrize("backend", ALL)
def test_cmyk_jpeg_becomes_rgb(photo, backend):
    out = decode_image(jpeg_bytes(photo, mode="CMYK"), backend=backend)
    assert out.shape == (181, 243, 3)
    assert np.abs(out.astype(np.int16) - photo).mean() < 12, "CMYK not converted (inverted or channel swap?)"


@pytest.mark.parametrize("backend", ALL)
def test_png_alpha_and_palette(photo, backend):
    rgba = Image.fromarray(photo).convert("RGBA")
    out = decode_image(png_bytes(rgba), backend=backend)
    assert out.shape == (181, 243, 3) and np.array_equal(out, photo)
    pal = Image.fromarray(photo).convert("P", palette=Image.Palette.ADAPTIVE)
    out = decode_image(png_bytes(pal), backend=backend)
    assert np.array_equal(out, np.asarray(pal.convert("RGB")))


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("min_scale", [0.9, 0.6, 0.4, 0.26, 0.13, 0.05])
def test_reduced_decode_never_below_the_asked_size(photo, backend, min_scale):
    data = jpeg_bytes(photo)
    out = decode_image(data, min_scale=min_scale, backend=backend)
    assert out.shape[0] >= math.ceil(181 * min_scale - 1e-9) and out.shape[1] >= math.ceil(243 * min_scale - 1e-9)
    if min_scale <= 0.4:
        assert out.shape[0] < 181, "no DCT reduction happened"
    # The reduced image still shows the same picture.
    small = np.asarray(Image.fromarray(photo).resize(out.shape[1::-1], Image.Resampling.BOX)).astype(np.int16)
    assert np.abs(out.astype(np.int16) - small).mean() < 8


def test_reduced_scale_picks_smallest_sufficient():
    from fractions import Fraction

    scales = tuple(sorted(Fraction(n, 8) for n in range(1, 9)))
    assert dec.reduced_scale(800, 600, 0.5, scales) == Fraction(1, 2)
    assert dec.reduced_scale(800, 600, 0.3, scales) == Fraction(3, 8)
    assert dec.reduced_scale(800, 600, 1.0, scales) == 1
    assert dec.reduced_scale(9, 9, 0.12, scales) == Fraction(1, 8)  # ceil(9/8) = 2 >= ceil(1.08) = 2


@pytest.mark.parametrize("backend", ALL)
def test_corrupt_and_truncated_raise_decode_error(photo, backend):
    data = jpeg_bytes(photo)
    with pytest.raises(DecodeError, match="truncated"):
        decode_image(data[: len(data) // 2], backend=backend)
    with pytest.raises(DecodeError):
        decode_image(b"\xff\xd8" + b"garbage" * 50 + b"\xff\xd9", backend=backend)
    with pytest.raises(DecodeError):
        decode_image(b"not an image at all", backend=backend)
    png = png_bytes(Image.fromarray(photo))
    with pytest.raises(DecodeError):
        decode_image(png[: len(png) // 2], backend=backend)


def test_image_size_reads_headers(photo):
    assert image_size(jpeg_bytes(photo)) == (181, 243)
    assert image_size(png_bytes(Image.fromarray(photo))) == (181, 243)
    with pytest.raises(DecodeError):
        image_size(b"\xff\xd8\xff\xe0\x00\x10JFIF")


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown decoder backend 'nvjpeg'"):
        get_decoder("nvjpeg")


def test_missing_turbojpeg_warns_once_and_falls_back(monkeypatch):
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    monkeypatch.setattr(dec, "_available", lambda name: name != "turbojpeg")
    monkeypatch.setattr(dec, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dec.default_backend() == "opencv"
        assert dec.default_backend() == "opencv"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "pip install PyTurboJPEG" in messages[0]
