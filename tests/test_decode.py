import io
import math
import resource
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import flip_scan_bytes as _flip_scan_bytes
from conftest import jpeg_bytes, make_image, need_formats, png_bytes
from PIL import Image

from fastload import decode as dec
from fastload.decode import BACKENDS, DecodeError, backends, decode_image, get_decoder, image_size, registry
from fastload.photos.bundled import source_photos

ALL = [b for b in BACKENDS if b not in dec.JPEG_BACKENDS or backends.available(b)]
# The strict libjpeg-turbo backends loadable here (simplejpeg is a dependency: always).
STRICT = [b for b in dec.JPEG_BACKENDS if backends.available(b)]


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


def _fresh_default(monkeypatch):
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    monkeypatch.setattr(backends, "_cache", {})
    monkeypatch.setattr(registry, "_warned", False)


def _warnings_of(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
        assert call() == result
    return result, [str(w.message) for w in caught]


def _no_system_library(monkeypatch):
    import ctypes.util

    import turbojpeg

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(turbojpeg, "DEFAULT_LIB_PATHS", {})
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


def test_pip_alone_gives_the_strict_fast_decoder_without_a_warning(monkeypatch):
    """No system libturbojpeg (the GPU machines have none): simplejpeg's bundled
    libjpeg-turbo is the default, with no fall-back warning."""
    _fresh_default(monkeypatch)
    _no_system_library(monkeypatch)
    backend, messages = _warnings_of(dec.default_backend)
    assert backend == "simplejpeg" and messages == []
    with pytest.raises(ImportError, match="not installed; fix: sudo apt-get install libturbojpeg0"):
        get_decoder("turbojpeg")
    monkeypatch.setattr(backends, "_cache", {})
    monkeypatch.setenv("FASTLOAD_NO_SYSTEM_TURBOJPEG", "1")  # what the pip-only venv test sets
    with pytest.raises(ImportError, match="hidden by FASTLOAD_NO_SYSTEM_TURBOJPEG=1"):
        get_decoder("turbojpeg")


def _no_simplejpeg(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import fails


def test_without_any_libjpeg_turbo_warns_once_with_the_install_commands(monkeypatch):
    _fresh_default(monkeypatch)
    _no_system_library(monkeypatch)
    _no_simplejpeg(monkeypatch)
    backend, messages = _warnings_of(dec.default_backend)
    assert backend == "opencv" and len(messages) == 1
    assert "decoding JPEG with OpenCV" in messages[0] and "fix: pip install simplejpeg" in messages[0]
    with pytest.raises(ImportError, match="simplejpeg is not installed"):
        get_decoder("simplejpeg")


@pytest.mark.decoder("turbojpeg")
def test_system_library_alone_is_used_without_a_warning(monkeypatch):
    _fresh_default(monkeypatch)
    _no_simplejpeg(monkeypatch)
    assert _warnings_of(dec.default_backend) == ("turbojpeg", [])


def test_too_old_library_is_not_called_missing(monkeypatch):
    from fastload.decode import turbo

    class Old:  # a libturbojpeg from before TurboJPEG 1.2: no tjDecompress2
        tjInitDecompress = tjDestroy = tjGetErrorStr = object()

    _fresh_default(monkeypatch)
    monkeypatch.setattr(turbo, "_library_path", lambda: "/usr/lib/libturbojpeg.so.0")
    monkeypatch.setattr(turbo.ctypes, "CDLL", lambda path: Old())
    assert _warnings_of(dec.default_backend) == ("simplejpeg", [])
    with pytest.raises(ImportError) as err:
        get_decoder("turbojpeg")
    message = str(err.value)
    assert "libturbojpeg at /usr/lib/libturbojpeg.so.0 is too old: it lacks tjDecompress2" in message
    assert "not installed" not in message and "--only-upgrade libturbojpeg0" in message


@pytest.mark.decoder("turbojpeg")
def test_the_system_library_is_the_default_only_where_measured_faster(monkeypatch):
    from fastload.decode import costs

    for measured, expected in (("turbojpeg", "turbojpeg"), ("simplejpeg", "simplejpeg")):
        _fresh_default(monkeypatch)
        monkeypatch.delenv("FASTLOAD_NO_CALIBRATION", raising=False)
        # The registry's own name for it (imported by name: patching costs' alone changes nothing).
        monkeypatch.setattr(registry, "load_or_calibrate", lambda m=measured: {**costs.DEFAULT_COSTS, "backend": m})
        assert dec.default_backend() == expected
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    assert dec.default_backend() == "simplejpeg"


@pytest.mark.decoder("turbojpeg")
def test_backend_choice_needs_the_margin(monkeypatch):
    from fastload.decode import costs

    blobs = [jpeg_bytes(make_image(i, 64, 80)) for i in range(2)]
    name, us = costs.choose_backend(blobs, rounds=1)
    assert set(us) == {"simplejpeg", "turbojpeg"} and all(v > 0 for v in us.values())
    # With libjpeg-turbo >= 3 (strict region decodes) the system library wins unless slower by the margin.
    margin = 1 / costs.BACKEND_MARGIN if dec.get_decoder("turbojpeg").strict_regions else costs.BACKEND_MARGIN
    assert name == ("turbojpeg" if us["turbojpeg"] <= margin * us["simplejpeg"] else "simplejpeg")


@pytest.mark.decoder("turbojpeg")
def test_pyturbojpeg_2_beside_libjpeg_turbo_2_still_decodes(monkeypatch, photo):
    """pip resolving PyTurboJPEG 2.x (whose TurboJPEG() refuses libjpeg-turbo < 3) must not
    cost the fast decoder: fastload only takes PyTurboJPEG's list of library paths."""
    import sys
    import types

    from fastload.decode import turbo

    fake = types.ModuleType("turbojpeg")
    fake.__version__ = "2.6.1"
    fake.DEFAULT_LIB_PATHS = {}

    class TurboJPEG:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("PyTurboJPEG 2.0 requires libjpeg-turbo 3.0 or later.")

    fake.TurboJPEG = TurboJPEG
    monkeypatch.setitem(sys.modules, "turbojpeg", fake)
    data = jpeg_bytes(photo)
    assert np.array_equal(turbo.TurboJPEGDecoder().decode(data), decode_image(data, backend="turbojpeg"))


def test_pyturbojpeg_requirement_excludes_2x():
    """PyTurboJPEG 2.x needs libjpeg-turbo >= 3, which Debian 12 and Ubuntu 22.04 do not have."""
    import os

    import tomllib
    from packaging.requirements import Requirement

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if d.lower().startswith("pyturbojpeg")]
    assert "1.8.3" in req.specifier and "2.0.0" not in req.specifier and "2.6.1" not in req.specifier


# --- corrupt entropy-coded data ---------------------------------------------------------


def _libjpeg_complains(data: bytes) -> bool:
    """Whether libjpeg warns or fails on ``data``, asked through PyTurboJPEG (in one thread
    only: catch_warnings changes process-wide state), else through simplejpeg itself."""
    if not backends.available("turbojpeg"):
        import simplejpeg

        try:
            simplejpeg.decode_jpeg(data, strict=True)
        except ValueError:
            return True
        return False
    import turbojpeg

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            turbojpeg.TurboJPEG().decode(data)
        except OSError:
            return True
    return bool(caught)


def _pillow_pixels(data: bytes) -> np.ndarray | None:
    try:
        with Image.open(io.BytesIO(data)) as img:  # Pillow decodes past libjpeg's warnings
            return np.asarray(img.convert("RGB"))
    except OSError:  # libjpeg's fatal errors
        return None


@pytest.fixture(scope="module")
def real_jpegs():
    try:
        photos = source_photos()
    except ImportError as e:
        pytest.skip(str(e))
    names = ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "rocket.jpg", "camera.png")
    return {(name, q): jpeg_bytes(photos[name], quality=q) for name in names for q in (75, 95)}


@pytest.mark.parametrize("backend", STRICT)
def test_corrupt_scan_data_in_real_photos_is_a_decode_error(real_jpegs, backend):
    warned = 0
    for (name, q), data in real_jpegs.items():
        clean = decode_image(data, backend=backend)
        assert np.abs(clean.astype(np.int16) - _pillow_pixels(data)).mean() < 1, "clean photo decodes wrong"
        for seed in range(8):
            bad = _flip_scan_bytes(data, seed)
            if not _libjpeg_complains(bad):
                # The Huffman stream fell back in step: libjpeg sees nothing, and JPEG has no
                # checksum for any decoder to see it with (a few blocks, or a colour shift).
                decode_image(bad, backend=backend)
                continue
            warned += 1
            damaged = _pillow_pixels(bad)
            assert damaged is None or np.any(damaged != clean), f"{name} q{q} seed {seed}"
            # libjpeg's own message, e.g. "Corrupt JPEG data: 83 extraneous bytes before marker 0xd9"
            with pytest.raises(DecodeError, match=r"^libjpeg-turbo: \w+"):
                decode_image(bad, backend=backend)
            with pytest.raises(DecodeError, match=r"^libjpeg-turbo: \w+"):
                decode_image(bad, min_scale=0.3, backend=backend)  # DCT-reduced decode too
            scratch = np.empty(clean.size, np.uint8)
            with pytest.raises(DecodeError, match=r"^libjpeg-turbo: \w+"):  # into a caller's buffer too
                get_decoder(backend).decode(bad, out=scratch)
    assert warned >= len(real_jpegs) * 8 // 3, f"only {warned} corruptions reached libjpeg's checks"


@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.slow  # 4-8 s: make test stays under 4 minutes (make test-slow runs it)
def test_threads_attribute_corrupt_jpeg_errors_to_exactly_their_files(real_jpegs, backend):
    items = []
    for data in real_jpegs.values():
        items.append(data)
        corrupt = [b for b in (_flip_scan_bytes(data, s) for s in range(30)) if _libjpeg_complains(b)]
        items += corrupt[:2]

    def outcome(data: bytes):
        try:
            img = decode_image(data, backend=backend)
        except DecodeError as e:
            return str(e)
        return int(img.astype(np.int64).sum()), img.shape

    expected = [outcome(d) for d in items]
    errors = sum(isinstance(e, str) for e in expected)
    assert errors == len(items) - len(real_jpegs), "every corrupt JPEG must fail, every clean one decode"
    assert len({e for e in expected if isinstance(e, str)}) > errors // 2  # messages tell files apart
    rng = np.random.default_rng(0)
    with ThreadPoolExecutor(8) as pool:
        for _ in range(4):
            order = rng.permutation(len(items))
            got = list(pool.map(outcome, [items[i] for i in order]))
            assert got == [expected[i] for i in order]


# --- pixel limit ------------------------------------------------------------------------


def _claiming(data: bytes, h: int, w: int) -> bytes:
    """A real JPEG whose frame header claims h x w."""
    i = data.index(b"\xff\xc0")
    return data[: i + 5] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + data[i + 9 :]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("backend", ALL)
def test_huge_header_fails_fast_before_allocating(backend):
    data = _claiming(jpeg_bytes(make_image(2, 256, 320), quality=95), 65500, 65500)
    peak = _peak_rss_mb()
    start = time.perf_counter()
    with pytest.raises(DecodeError, match=r"65500x65500 = 4,290,250,000 pixels is over the limit of 89,478,485"):
        decode_image(data, backend=backend)
    assert time.perf_counter() - start < 0.5
    assert _peak_rss_mb() - peak < 200


def test_huge_png_and_pillow_format_headers_fail():
    png = bytearray(png_bytes(Image.fromarray(make_image(3, 8, 8))))
    png[16:24] = (70000).to_bytes(4, "big") + (60000).to_bytes(4, "big")
    with pytest.raises(DecodeError, match="70000x60000"):
        decode_image(bytes(png))
    bmp = io.BytesIO()
    Image.fromarray(make_image(3, 8, 8)).save(bmp, format="BMP")
    raw = bytearray(bmp.getvalue())
    raw[18:26] = (12000).to_bytes(4, "little") + (11000).to_bytes(4, "little")  # 132M: Pillow only warns
    with pytest.warns(Image.DecompressionBombWarning), pytest.raises(DecodeError, match="12000x11000"):
        decode_image(bytes(raw))


def test_pixel_limit_per_call_module_and_dataset(monkeypatch):
    from fastload.datasets.base import ImageDataset
    from fastload.transforms import eval as eval_preset

    data = jpeg_bytes(make_image(4, 60, 80))  # 4,800 pixels
    assert decode_image(data, max_pixels=4800).shape == (60, 80, 3)
    with pytest.raises(DecodeError, match="80x60 = 4,800 pixels is over the limit of 4,799"):
        decode_image(data, max_pixels=4799)
    monkeypatch.setattr(dec, "MAX_IMAGE_PIXELS", 4799)
    with pytest.raises(DecodeError, match="limit of 4,799"):
        decode_image(data)
    assert decode_image(data, max_pixels=10**9).shape == (60, 80, 3)  # per call wins
    monkeypatch.setattr(dec, "MAX_IMAGE_PIXELS", None)  # Pillow's idiom: None disables
    assert decode_image(data).shape == (60, 80, 3)
    for bad, err in ((0, ValueError), (-5, ValueError), (1.5e6, TypeError), (True, TypeError)):
        with pytest.raises(err, match="max_pixels"):
            decode_image(data, max_pixels=bad)

    class OneSample(ImageDataset):
        def __len__(self):
            return 1

        def read(self, index):
            return data, 0

        def describe(self, index):
            return "mem://0.jpg"

    for transform in (None, eval_preset(32)):
        with pytest.raises(DecodeError, match=r"sample 0 \(mem://0.jpg\): .*limit of 4,000"):
            OneSample([0], transform, max_pixels=4000).load(0)
        assert OneSample([0], transform, max_pixels=4800).load(0)[0].shape[2] == 3
    assert OneSample([0]).max_pixels is None
    with pytest.raises(ValueError, match="max_pixels"):
        OneSample([0], max_pixels=0)


def test_read_header_parses_once_what_decoders_need(photo):
    from fastload.decode import ImageHeader, read_header

    assert read_header(jpeg_bytes(photo)) == ImageHeader(181, 243, "jpeg", 3, False)
    assert read_header(jpeg_bytes(photo, mode="L")).components == 1
    assert read_header(jpeg_bytes(photo, mode="CMYK")).components == 4
    buf = io.BytesIO()
    Image.fromarray(photo).save(buf, format="JPEG", progressive=True)
    assert read_header(buf.getvalue()).progressive
    assert read_header(png_bytes(Image.fromarray(photo).convert("RGBA"))) == ImageHeader(181, 243, "png", 4)


def test_max_pixels_none_switches_the_limit_off(monkeypatch):
    data = jpeg_bytes(make_image(4, 60, 80))  # 4,800 pixels
    monkeypatch.setattr(dec, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(DecodeError, match="limit of 100"):
        decode_image(data)  # the default is the module's limit
    assert decode_image(data, max_pixels=None).shape == (60, 80, 3)


def _pixel_limited(kind, folder, tmp_path, **kw):
    """A dataset of ``kind`` over ``folder``'s images, built with ``kw``, and a load of its first sample."""
    import fastload as fl

    if kind in ("lmdb", "tfrecord", "tfrecord-stream"):
        need_formats("lmdb" if kind == "lmdb" else "tfrecord")
        from fastload.convert import convert

        dst = str(tmp_path / kind)
        if not (tmp_path / kind).exists():
            convert(folder, dst, "lmdb" if kind == "lmdb" else "tfrecord", progress=False)
    if kind == "folder":
        ds = fl.ImageFolder(folder, **kw)
    elif kind == "list":
        listing = tmp_path / "list.txt"
        listing.write_text("c0/000.jpg 0\nc1/000.jpg 1\n")
        ds = fl.ImageList(listing, root=folder, **kw)
    elif kind == "arrays":
        ds = fl.ImageList.from_arrays(["c0/000.jpg"], [0], root=folder, **kw)
    elif kind == "lmdb":
        ds = fl.LMDBDataset(dst, **kw)
    elif kind == "tfrecord":
        ds = fl.TFRecordDataset(dst, **kw)
    else:
        ds = fl.TFRecordStream(dst, **kw)
        return lambda: ds.decode(next(iter(ds.records_for(0, 1))), 0, 0)
    return lambda: ds.load(0)


@pytest.mark.parametrize("kind", ["folder", "list", "arrays", "lmdb", "tfrecord", "tfrecord-stream"])
def test_every_dataset_takes_max_pixels(kind, folder, tmp_path, monkeypatch):
    with pytest.raises(DecodeError, match="over the limit of 100 pixels"):
        _pixel_limited(kind, folder, tmp_path, max_pixels=100)()
    monkeypatch.setattr(dec, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(DecodeError, match="over the limit of 100 pixels"):
        _pixel_limited(kind, folder, tmp_path)()
    load = _pixel_limited(kind, folder, tmp_path, max_pixels=None)
    image = load()
    assert (image if kind == "tfrecord-stream" else image[0]).ndim == 3  # None: no limit, not the module's


def test_fastload_info_shows_the_decoders(monkeypatch, capsys):
    import simplejpeg

    from fastload.cli import main

    _fresh_default(monkeypatch)
    monkeypatch.setenv("FASTLOAD_NO_CALIBRATION", "1")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"decoder simplejpeg: ok (simplejpeg {simplejpeg.__version__}, libjpeg-turbo bundled, strict)" in out
    assert "default decoder: simplejpeg" in out and "region decoder:" in out
    assert "decoder opencv: ok (JPEG not strict)" in out


@pytest.mark.parametrize("backend", STRICT)
def test_decode_into_a_callers_buffer(photo, backend):
    dec, data = get_decoder(backend), jpeg_bytes(photo)
    buf = np.zeros(181 * 243 * 3 + 100, np.uint8)
    img = dec.decode(data, out=buf)
    assert img.shape == (181, 243, 3) and np.shares_memory(img, buf)
    assert np.array_equal(img, dec.decode(data))
    half = dec.decode(data, 0.5, out=buf)
    assert half.shape == (91, 122, 3) and np.shares_memory(half, buf) and np.array_equal(half, dec.decode(data, 0.5))
    with pytest.raises(ValueError, match="at least 131949 bytes"):
        dec.decode(data, out=np.empty(1000, np.uint8))
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        dec.decode(data, out=np.empty((200, 300, 3), np.uint8)[:, ::2])
    png = png_bytes(Image.fromarray(photo))
    assert not np.shares_memory(dec.decode(png, out=buf), buf)  # other formats allocate their own


def test_a_planned_decode_never_returns_the_threads_scratch_buffer():
    from fastload.decode import read_header
    from fastload.decode.plan import execute, plan_for_key
    from fastload.decode.resize import Crop

    dec = get_decoder("simplejpeg")
    first, second = (jpeg_bytes(make_image(s, 64, 80)) for s in (1, 2))
    crop = Crop(0, 0, 64, 80, 64, 80, antialias=False)  # the whole image at its size: no resize at all
    kept = execute(plan_for_key("full", read_header(first), crop), first, dec, read_header(first), crop)
    expected = kept.copy()
    execute(plan_for_key("full", read_header(second), crop), second, dec, read_header(second), crop)
    assert np.array_equal(kept, expected), "the first result was overwritten by the next decode"
