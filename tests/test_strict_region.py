"""The strict region decode (TurboJPEG 3 through the system libturbojpeg, libjpeg-turbo >= 3.0):
the crop's rows to the bottom, every block entropy-decoded, libjpeg's warnings as errors.

Skipped where the system has no libturbojpeg 3 (Debian and Ubuntu ship 2.1; Fedora, conda-forge
and Homebrew ship 3.x). Run here with a libjpeg-turbo 3.x build on LD_LIBRARY_PATH.
"""

import os
import sys
from fractions import Fraction

import numpy as np
import pytest

from fastload.decode import DecodeError, get_decoder, read_header

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from damage import damaged_versions, encode  # noqa: E402


@pytest.fixture(scope="module")
def turbo3():
    try:
        decoder = get_decoder("turbojpeg")
    except ImportError as e:
        pytest.skip(f"needs the system libturbojpeg (libjpeg-turbo >= 3.0): {e}")
    if not decoder.strict_regions:
        pytest.skip(f"needs libjpeg-turbo >= 3.0 (TurboJPEG 3); {decoder.library_file()} is older")
    return decoder


@pytest.fixture(scope="module")
def photos():
    try:
        from fastload.photos.bundled import source_photos
    except ImportError as e:
        pytest.skip(str(e))
    return sorted(source_photos(gray=False).items())[:4]


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(1, 2), Fraction(3, 8), Fraction(1, 4), Fraction(1, 8)])
@pytest.mark.parametrize("progressive", [False, True])
def test_a_region_is_the_full_decode_s_pixels(turbo3, photos, scale, progressive):
    rng = np.random.default_rng(int(scale * 8) + 10 * progressive)
    for _, rgb in photos:
        data = encode(rgb, 90, progressive)
        header = read_header(data)
        full = turbo3.decode(data, scale=scale)
        h, w = full.shape[:2]
        for fast in (False, True):
            ref = turbo3.decode(data, scale=scale, fast_upsample=fast)
            top = int(rng.integers(0, h - 1))
            left = int(rng.integers(0, w - 2))
            mcu = -(-16 * scale.numerator // scale.denominator)  # 4:2:0: 16 pixels, scaled
            # A left edge between iMCUs and one on the grid (where fancy upsampling's edge would show).
            for left in (left, max(mcu, left // mcu * mcu)):
                right = int(rng.integers(left + 1, w + 1))
                img, (y0, x0) = turbo3.decode_region(data, header, scale, top, left, right, fast)
                assert y0 == top and x0 <= left and x0 + img.shape[1] >= right and y0 + img.shape[0] == h
                np.testing.assert_array_equal(img[:, left - x0 : right - x0], ref[top:, left:right])


def test_a_region_refuses_what_the_full_strict_decode_refuses(turbo3, photos):
    """Damage anywhere (above, beside or below the crop, cut short, no end marker) fails the
    region decode exactly when it fails the full strict decode (simplejpeg)."""
    rng = np.random.default_rng(5)
    reference = get_decoder("simplejpeg")
    checked = 0
    for p, (name, rgb) in enumerate(photos):
        data = encode(rgb, 90, progressive=p % 2 == 1)
        for d in damaged_versions(name, data, p % 2 == 1, rng, per_kind=3):
            try:
                reference.decode(d.data)
                refused = False
            except DecodeError:
                refused = True
            try:
                header = read_header(d.data)
            except DecodeError:
                assert refused
                continue
            h, w = header.height, header.width
            # A small crop in the middle: the damage is mostly above, beside or below it.
            top, left = h // 2, w // 2
            try:
                turbo3.decode_region(d.data, header, Fraction(1, 2), top // 2, left // 2, left // 2 + 32)
                region_refused = False
            except DecodeError:
                region_refused = True
            assert region_refused == refused, (d.kind, d.progressive)
            checked += refused
    assert checked >= 20


def test_a_sample_decoded_through_regions_has_the_whole_decode_s_pixels(turbo3, photos):
    """plan.execute with the TurboJPEG 3 decoder decodes only the rows and columns the crop
    reads; every plan (full, fast upsampling, each DCT scale) and crop path (cut and resized,
    exact-phase box, no antialias) gives the pixels of the whole decode, bit for bit."""
    from fastload.decode.plan import DecodePlan, execute
    from fastload.decode.resize import Crop, random_resized_crop

    rng = np.random.default_rng(11)
    for _, rgb in photos:
        data = encode(rgb, 90)
        header = read_header(data)
        h, w = header.height, header.width
        crops = [random_resized_crop(h, w, (64, 64), (0.05, 1.0), (3 / 4, 4 / 3), rng, aa) for aa in (True, False)]
        crops.append(Crop(h - 40.5, w - 50.25, 40.5, 50.25, 16, 20))  # at the far corner
        crops.append(Crop(0, 0, h, w, 32, 48))
        for crop in crops:
            for scale in (Fraction(1), Fraction(1, 2), Fraction(3, 8), Fraction(1, 4)):
                for fast in (False, True) if scale == 1 else (False,):
                    p = DecodePlan(scale, None, 0.0, fast)
                    got = execute(p, data, turbo3, header, crop)
                    whole = turbo3.decode(data, scale=scale, fast_upsample=fast)
                    want = crop.apply(whole, h, w, None, float(scale))
                    np.testing.assert_array_equal(got, want, err_msg=f"{crop} {scale} {fast}")
