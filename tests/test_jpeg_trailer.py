"""JPEGs with bytes after the end-of-image marker decode; JPEGs cut short are still refused."""

import io

import numpy as np
import pytest
from conftest import need_decoder
from PIL import Image

from fastload.decode import DecodeError, decode_image
from fastload.decode.header import check_jpeg_complete, jpeg_end

TRAILERS = (0, 1, 100, 4_095, 4_097, 20_000, 300_000)


@pytest.fixture(scope="module")
def photo() -> bytes:
    """A real photograph as a baseline JPEG with an EXIF block, and its end offset."""
    from fastload.photos.bundled import source_photos

    try:
        img = source_photos(gray=False)["chelsea.png"]
    except Exception as e:  # scikit-image's photos are optional
        pytest.skip(f"needs scikit-image's bundled photos: {e}")
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x010F] = "fastload test camera"  # Make
    Image.fromarray(img).save(buf, format="JPEG", quality=90, exif=exif)
    return buf.getvalue()


@pytest.fixture(scope="module")
def progressive(photo) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(photo)).save(buf, format="JPEG", quality=85, progressive=True)
    return buf.getvalue()


def _trailer(size: int, seed: int) -> bytes:
    """Camera-trailer-like bytes: random, a stray SOI and EOI marker at its start (an
    appended second image) and none in its last 4 KB."""
    body = np.random.default_rng(seed).integers(0, 256, size, np.uint8)
    body[body == 0xFF] = 0xFE
    return (b"\xff\xd8\x00\xff\xd9" + body.tobytes())[:size]


@pytest.mark.parametrize("size", TRAILERS)
@pytest.mark.parametrize("which", ["photo", "progressive"])
def test_bytes_after_the_end_marker_are_ignored(request, which, size):
    jpeg = request.getfixturevalue(which)
    data = jpeg + _trailer(size, size)
    assert jpeg_end(data) == len(jpeg)
    check_jpeg_complete(data)
    reference = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    assert np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).shape == reference.shape  # Pillow reads it
    for backend in ("pillow", "simplejpeg", "opencv"):
        try:
            need_decoder(backend)
        except pytest.skip.Exception:
            continue
        got = decode_image(data, backend=backend)
        assert got.shape == reference.shape
        np.testing.assert_array_equal(got, decode_image(jpeg, backend=backend))
    assert decode_image(np.frombuffer(data, np.uint8)).shape == reference.shape  # any buffer


@pytest.mark.parametrize("which", ["photo", "progressive"])
def test_cut_short_jpegs_are_still_refused(request, which):
    jpeg = request.getfixturevalue(which)
    n = len(jpeg)
    cuts = sorted({3, 20, 200, n // 10, n // 2, n - 5_000, n - 3, n - 2, n - 1})
    for cut in cuts:
        with pytest.raises(DecodeError, match="truncated JPEG"):
            check_jpeg_complete(jpeg[:cut])
        with pytest.raises(DecodeError):
            decode_image(jpeg[:cut])


def test_an_end_marker_inside_a_metadata_segment_does_not_count():
    """An APP segment holding FFD9 (an EXIF thumbnail's end) before a frame cut short."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(buf, format="JPEG")
    jpeg = buf.getvalue()
    app = b"\xff\xe1" + (2 + 6).to_bytes(2, "big") + b"\xff\xd8\x00\xff\xd9\x00"
    data = jpeg[:2] + app + jpeg[2:]
    assert jpeg_end(data) == len(data)
    with pytest.raises(DecodeError, match="truncated JPEG"):
        check_jpeg_complete(data[:len(data) - 100])


@pytest.mark.parametrize("backend", ["simplejpeg", "turbojpeg"])
@pytest.mark.parametrize("which", ["photo", "progressive"])
def test_libjpeg_turbo_refuses_cut_short_files_itself_and_names_the_cause(request, which, backend, monkeypatch):
    """The strict decoders walk to the end-of-image marker only after libjpeg refused the
    file (its own end-of-data warning catches every cut): an intact decode never walks, a
    cut-short one still says 'truncated JPEG'."""
    need_decoder(backend)
    from fastload.decode import get_decoder, header, libjpeg

    jpeg = request.getfixturevalue(which)
    walks = []
    monkeypatch.setattr(libjpeg, "check_jpeg_complete", lambda d: walks.append(len(d)) or header.jpeg_end(d))
    decoder = get_decoder(backend)
    decoder.decode(jpeg)
    assert walks == []
    n = len(jpeg)
    for cut in (n // 10, n // 2, n - 3, n - 2, n - 1):
        with pytest.raises(DecodeError, match="truncated JPEG"):
            decoder.decode(jpeg[:cut])
    assert len(walks) == 5
