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
