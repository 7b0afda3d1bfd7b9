"""A damaged-JPEG corpus made from real photographs: the damage a dataset's files suffer.

Each photograph (scikit-image's bundled ones, ``fastload.photos.bundled``) is encoded as a
baseline and as a progressive JPEG, and each encoding is damaged in the ways files are
damaged on disks and in transfers: cut short at many offsets through its entropy-coded
data (a cut also loses the end-of-image marker), its end-of-image marker alone missing,
bytes appended after it (a valid file: a decoder must accept it), and 1-3 bytes of its
entropy-coded data changed, in the top, middle and bottom third of the scan data.
Used by ``bench_damage.py`` (which decode mode detects which damage) and by the tests
that no damaged sample reaches a batch.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

#: Kinds of damage, in table order.
KINDS = ("truncated", "no EOI", "trailing bytes", "flip, top third", "flip, middle third", "flip, bottom third")


@dataclass(frozen=True)
class Damaged:
    """One damaged file: the photo and encoding it came from, the damage, the bytes."""

    photo: str
    progressive: bool
    kind: str
    data: bytes


def encode(rgb: np.ndarray, quality: int = 90, progressive: bool = False) -> bytes:
    """``rgb`` as a 4:2:0 JPEG (Pillow, libjpeg-turbo)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=quality, progressive=progressive, subsampling=2)
    return buf.getvalue()


def scan_start(data: bytes) -> int:
    """The offset of the first entropy-coded byte (just past the first start-of-scan header)."""
    i = data.index(b"\xff\xda")
    return i + 2 + int.from_bytes(data[i + 2 : i + 4], "big")


def flip(data: bytes, lo: int, hi: int, rng: np.random.Generator) -> bytes:
    """``data`` with 1-3 bytes in [lo, hi) XOR-ed with random non-zero values."""
    out = bytearray(data)
    for pos in rng.integers(lo, hi, size=int(rng.integers(1, 4))):
        out[int(pos)] ^= int(rng.integers(1, 256))
    return bytes(out)


def damaged_versions(photo: str, data: bytes, progressive: bool, rng: np.random.Generator, per_kind: int) -> list[Damaged]:
    """``per_kind`` damaged copies of ``data`` for each kind in :data:`KINDS` (one for "no EOI"
    and "trailing bytes": there is one way to lose the marker and appending is always valid)."""
    start, end = scan_start(data), len(data) - 2  # the entropy-coded data, EOI excluded
    out = [Damaged(photo, progressive, "no EOI", data[:-2])]
    out.append(Damaged(photo, progressive, "trailing bytes", data + bytes(rng.integers(0, 256, 64, dtype=np.uint8))))
    for k in range(per_kind):  # cuts spread over the whole scan data
        cut = start + (end - start) * (k + 1) // (per_kind + 1)
        out.append(Damaged(photo, progressive, "truncated", data[:cut]))
    third = (end - start) // 3
    for t, kind in enumerate(KINDS[3:]):
        lo = start + t * third
        out += [Damaged(photo, progressive, kind, flip(data, lo, lo + third, rng)) for _ in range(per_kind)]
    return out


def corpus(per_kind: int = 8, photos: int | None = None, seed: int = 0) -> tuple[dict[tuple[str, bool], bytes], list[Damaged]]:
    """(the intact JPEGs by (photo, progressive), their damaged versions).

    Raises:
        ImportError: scikit-image's photographs are not installed.
    """
    from fastload.photos.bundled import source_photos

    rng = np.random.default_rng(seed)
    sources = sorted(source_photos(gray=False).items())[:photos]
    intact: dict[tuple[str, bool], bytes] = {}
    damaged: list[Damaged] = []
    for name, rgb in sources:
        for progressive in (False, True):
            data = encode(rgb, int(rng.integers(85, 96)), progressive)
            intact[(name, progressive)] = data
            damaged += damaged_versions(name, data, progressive, rng, per_kind)
    return intact, damaged
