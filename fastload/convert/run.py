"""convert(): read any dataset fastload opens, optionally re-encode, write LMDB, TFRecord or WebDataset
shards, verify."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from tqdm import tqdm

from ..datasets.open import open_dataset
from ..datasets.tfrecord import TFRecordDataset, TFRecordStream
from ..datasets.webdataset import WebDataset
from ..decode import JPEG_BACKENDS, DecodeError, decode_image, default_backend
from ..verified import NOT_VERIFIED, crc32c
from .staging import check_apart
from .verify import VerifyError, verify
from .wds_writer import write_wds
from .writers import write_lmdb, write_tfrecord

FORMATS = ("lmdb", "tfrecord", "wds")

CHUNK = 512


def reencode(data: bytes, resize_shorter: int | None, quality: int) -> bytes:
    """Decodes, shrinks the shorter side to ``resize_shorter`` (never enlarges), re-encodes JPEG."""
    import cv2

    img = decode_image(data)
    h, w = img.shape[:2]
    if resize_shorter and min(h, w) > resize_shorter:
        s = resize_shorter / min(h, w)
        img = cv2.resize(img, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)
    ok, enc = cv2.imencode(".jpg", img[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return enc.tobytes()


def read_all(
    source: Any,
    workers: int,
    resize_shorter: int | None,
    quality: int | None,
    desc: str,
    progress: bool,
    order: np.ndarray | None = None,
    check: Callable[[int, int, bytes], None] | None = None,
) -> Iterator[tuple[int, bytes, int]]:
    """(position, encoded bytes, label) in position order, read by ``workers`` threads: position
    ``j`` holds source index ``order[j]`` (default: ``j``). ``check(j, i, data)`` runs in the
    reading thread on each record's final bytes before it is handed on (the strict decode of
    ``--verify``).

    Raises:
        DecodeError: An image does not decode for re-encoding (names the source record and index).
    """

    def fetch(j: int) -> tuple[int, bytes, int]:
        i = j if order is None else int(order[j])
        data, label = source.read_checked(i)  # bytes changed since they were verified are not copied
        data = bytes(data)
        if resize_shorter or quality:
            try:
                data = reencode(data, resize_shorter, quality or 90)
            except Exception as e:
                raise DecodeError(f"cannot re-encode index {i} ({source.describe(i)}): {type(e).__name__}: {e}") from e
        if check is not None:
            check(j, i, data)
        return j, data, label

    n = len(source)
    with (
        ThreadPoolExecutor(max(1, workers)) as pool,
        tqdm(total=n, desc=desc, unit="images", disable=not progress) as bar,
    ):
        for start in range(0, n, CHUNK):
            for item in pool.map(fetch, range(start, min(n, start + CHUNK))):
                yield item
                bar.update(1)


def convert(
    src: str,
    dst: str,
    fmt: str,
    *,
    shards: int = 1,
    workers: int = 4,
    resize_shorter: int | None = None,
    quality: int | None = None,
    verify_output: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    shard_bytes: int | None = None,
    shard_samples: int | None = None,
    shuffle_seed: int | None = 0,
    **open_kwargs: Any,
) -> dict:
    """Converts dataset ``src`` (anything open_dataset reads) to ``fmt`` ("lmdb", "tfrecord" or
    "wds": WebDataset tar shards of at most ``shard_bytes`` bytes or ``shard_samples`` samples,
    1 GB when neither is given) at ``dst``.

    WebDataset shards get the samples in an order drawn from ``shuffle_seed`` (None: the
    source's order), since a stream mixes only the shards a reader holds at once: a
    class-sorted source would otherwise give batches of a few classes. Each sample's key
    is its source index.

    With ``verify_output``, every record's bytes (as written) are decoded strictly while they
    are read, and those the strict decode accepts are recorded with their CRC32C and
    "fastload VERSION, strict, DECODER" in the dataset's own metadata (the LMDB's metadata
    record; the ``verified`` section of the TFRecord or WebDataset sidecar, see
    :mod:`fastload.datasets.verified_sidecar`: for TFRecord the CRC32C of each record's data,
    the one its frame holds masked; for WebDataset that of each image member), so that
    the datasets decode them the cheapest way the crop allows while their checksum holds
    and refuse them once it does not (:mod:`fastload.verified`); records
    that fail are written, left unverified (decoded strictly when read), and listed in the
    VerifyError. Then the output is read back: count, labels and checksums (each record was
    decoded strictly already; without a strict decoder here, every record is decoded then).

    Class names travel with the data (LMDB metadata record, TFRecord and WebDataset sidecars). Missing
    parent folders of ``dst`` are created. Output is written under a hidden temporary
    name and renamed when complete.

    Returns:
        {"records", "seconds", "images_per_s", "bytes"}.

    Raises:
        VerifyError: ``verify_output`` found records that do not read back (all listed).
        NoSpaceError: ``dst``'s filesystem filled up; the partial output is removed and the
            error says about how many more MB the whole output needs.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if quality is not None and not 1 <= quality <= 100:
        raise ValueError(f"--quality must be in 1..100, got {quality}")
    if resize_shorter is not None and resize_shorter < 1:
        raise ValueError(f"--resize-shorter must be positive, got {resize_shorter}")
    check_apart(src, dst)
    source = open_dataset(src, **open_kwargs)
    if isinstance(source, TFRecordStream):
        raise ValueError(f"{src} is a compressed stream; decompress it to convert")
    n = len(source)
    classes = source.classes
    order = None
    if fmt == "wds" and shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(n)
    labels = None if isinstance(source, (TFRecordDataset, WebDataset)) else source.labels.copy()
    if labels is not None and order is not None:
        labels = labels[order]
    start = time.perf_counter()
    from .. import __version__

    strict = verify_output and default_backend() in JPEG_BACKENDS
    verified = np.full(n, NOT_VERIFIED, np.int64) if strict else None
    refused: dict[int, str] = {}
    by = f"fastload {__version__}, strict, {default_backend()}"

    def strict_decode(j: int, i: int, data: bytes) -> None:
        try:
            decode_image(data)
        except Exception as e:  # written all the same, unverified; listed in the VerifyError
            refused[j] = f"record {j} (source index {i}, {source.describe(i)}): does not decode strictly: {e}"
            return
        assert verified is not None
        verified[j] = crc32c(data)

    records = read_all(
        source,
        workers,
        resize_shorter,
        quality,
        f"{os.path.basename(src)} → {fmt}",
        progress,
        order,
        strict_decode if strict else None,
    )
    if labels is None:  # TFRecord and WebDataset labels are only known while reading
        got = np.zeros(n, np.int64)

        def record_labels(it):
            for i, data, label in it:
                got[i] = label
                yield i, data, label

        records = record_labels(records)
    if fmt == "lmdb":
        crcs = write_lmdb(records, dst, n, classes, overwrite, verified=verified, verified_by=by)
    elif fmt == "wds":
        if shard_bytes is None and shard_samples is None:
            shard_bytes = 10**9
        crcs = write_wds(
            records,
            dst,
            n,
            classes,
            shard_bytes=shard_bytes,
            shard_samples=shard_samples,
            keys=order,
            overwrite=overwrite,
            verified=verified,
            verified_by=by,
        )
    else:
        names = source.paths
        crcs = write_tfrecord(
            records,
            dst,
            n,
            shards,
            classes,
            names.__getitem__ if names is not None else None,
            overwrite=overwrite,
            verified=verified,
            verified_by=by,
        )
    seconds = time.perf_counter() - start
    if labels is None:
        labels = got
    if verify_output:
        failures = [refused[j] for j in sorted(refused)]
        try:  # every record was decoded strictly above (refused ones are listed): none is decoded again
            verify(dst, crcs, labels, progress, workers, decoded=None if verified is None else np.ones(n, bool))
        except VerifyError as e:
            failures += e.failures
        if failures:
            raise VerifyError(dst, failures, n)
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(dst) for f in fs)
    return {"records": n, "seconds": seconds, "images_per_s": n / seconds, "bytes": size}
