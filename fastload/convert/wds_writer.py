"""Writer of WebDataset tar shards (``<prefix>-000000.tar`` ...), staged then published.

Each sample ``<key>.<ext>`` (the image's bytes as they came, ``ext`` from its signature)
plus ``<key>.cls`` (the label as text); keys are the source index, zero-padded. Members carry no
owner and mtime 0, so a rerun writes the same bytes. A sidecar ``<prefix>.fastload.json`` holds the class names and
each shard's sample count, and after ``--verify`` each image member's CRC32C where the strict
decode accepted it (:mod:`fastload.datasets.verified_sidecar`).
"""

from __future__ import annotations

import io
import os
import tarfile
import zlib
from collections.abc import Iterator, Sequence

import numpy as np

from ..datasets.verified_sidecar import OF_IMAGE_MEMBER, verified_section
from ..datasets.webdataset.sidecar import write_sidecar
from ..datasets.webdataset.tar import BLOCK
from .staging import close_quietly, discard, no_space, publish, stage

Records = Iterator[tuple[int, bytes, int]]  # (index, encoded bytes, label) in index order
SIGNATURES = (
    (b"\xff\xd8", "jpg"),
    (b"\x89PNG", "png"),
    (b"BM", "bmp"),
    (b"II*\0", "tif"),
    (b"MM\0*", "tif"),
    (b"P6", "ppm"),
    (b"P5", "pgm"),
)


def image_ext(data: bytes) -> str:
    """The extension an image's bytes call for (jpg, png, webp, ...; "bin" when unknown)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((ext for sig, ext in SIGNATURES if data.startswith(sig)), "bin")


def _member_bytes(size: int) -> int:
    return BLOCK + -(-size // BLOCK) * BLOCK


def _shard_bytes(members: int) -> int:
    """The size of a shard whose members take ``members`` bytes: with the two zero blocks that
    end an archive, padded to tarfile's record size (10 KiB), as tarfile closes it."""
    return -(-(members + 2 * BLOCK) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def _add(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    out.addfile(info, io.BytesIO(data))


def write_wds(
    records: Records,
    dst: str,
    n: int,
    classes: Sequence[str] | None,
    *,
    shard_bytes: int | None = None,
    shard_samples: int | None = None,
    keys: np.ndarray | None = None,
    prefix: str = "shard",
    overwrite: bool = False,
    verified: np.ndarray | None = None,
    verified_by: str = "",
) -> np.ndarray:
    """Writes WebDataset shards into folder ``dst``; returns the crc32 of every image's bytes.

    ``records`` come as (position, bytes, label); the sample at position ``j`` gets key
    ``keys[j]`` (default ``j``), zero-padded.

    A shard ends before the sample that would take it past ``shard_bytes`` (every shard
    holds at least one sample) or once it holds ``shard_samples``.

    ``verified``: per position, the CRC32C of the image where a strict decode accepted it,
    else NOT_VERIFIED, set by the time the record arrives; written per shard, in the shard's
    order, into the sidecar's ``verified`` section with ``verified_by``.
    """
    for name, value in (("shard_bytes", shard_bytes), ("shard_samples", shard_samples)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if shard_bytes is None and shard_samples is None:
        raise ValueError("give a target shard size: shard_bytes or shard_samples")
    tmp = stage(dst, overwrite)
    crcs = np.zeros(n, np.uint32)
    width = max(6, len(str(n)))
    counts: dict[str, int] = {}
    checked: dict[str, list[int]] = {}
    out: tarfile.TarFile | None = None
    size = count = written = fed_bytes = 0
    published = False
    try:
        for i, data, label in records:
            fed_bytes += len(data)
            need = _member_bytes(len(data)) + _member_bytes(len(str(label)))
            if (
                out is None
                or (shard_samples and count >= shard_samples)
                or (shard_bytes and count and _shard_bytes(size + need) > shard_bytes)
            ):
                if out is not None:
                    out.close()
                name = f"{prefix}-{len(counts):06d}.tar"
                out = tarfile.open(os.path.join(tmp, name), "w", format=tarfile.GNU_FORMAT)
                counts[name], size, count = 0, 0, 0
                checked[name] = []
            key = f"{i if keys is None else int(keys[i]):0{width}d}"
            _add(out, f"{key}.{image_ext(data)}", data)
            _add(out, f"{key}.cls", str(label).encode())
            crcs[i] = zlib.crc32(data)
            if verified is not None:
                checked[name].append(int(verified[i]))
            counts[name] += 1
            size, count, written = size + need, count + 1, written + 1
        if out is not None:
            out.close()
            out = None
        if written != n:
            raise RuntimeError(f"expected {n} records, got {written}")
        section = None if verified is None else verified_section(verified_by, OF_IMAGE_MEMBER, checked)
        write_sidecar(tmp, prefix, classes, counts, section)
        publish(tmp, dst, overwrite)
        published = True
    except OSError as e:
        close_quietly(out)  # tarfile writes its end blocks on close: on a full disk that fails too
        out = None
        full = no_space(e, tmp, dst, fed_bytes, written + 1, n)
        if full is not None:
            raise full from e
        raise
    finally:
        close_quietly(out)
        if not published:
            discard(tmp)
    return crcs
