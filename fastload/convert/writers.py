"""Writers of fastload's LMDB layout and of TFRecord shards, both staged then published."""

from __future__ import annotations

import os
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..datasets.lmdb_dataset import META_KEY, pack_meta
from ..datasets.storage import StringArray
from ..datasets.tfrecord import INDEX_SUFFIX, frame, make_example, write_meta
from ..datasets.verified_sidecar import OF_RECORD_DATA, verified_section
from ..decode import DecodeError, image_size, is_jpeg
from ..verified import NOT_VERIFIED, crc32c
from .staging import close_quietly, discard, no_space, publish, stage

COMMIT_EVERY = 2000

Records = Iterator[tuple[int, bytes, int]]  # (index, encoded bytes, label) in index order


def write_lmdb(
    records: Records,
    dst: str,
    n: int,
    classes: Sequence[str] | None,
    overwrite: bool = False,
    map_size: int = 1 << 26,
    *,
    verified: np.ndarray | None = None,
    verified_by: str = "",
) -> np.ndarray:
    """Writes fastload's LMDB layout; returns the crc32 of every record's bytes.

    ``verified``: per record, the CRC32C of its bytes where a strict decode accepted them, else
    NOT_VERIFIED, filled in by the time ``records`` ends; written into the metadata record
    with ``verified_by`` (:func:`~fastload.datasets.lmdb_dataset.pack_meta`)."""
    import lmdb

    tmp = stage(dst, overwrite)
    env = None
    crcs = np.zeros(n, np.uint32)
    labels = np.zeros(n, np.int64)
    keys = [b"%09d" % i for i in range(n)]
    pending: list[tuple[bytes, bytes]] = []

    def commit() -> None:
        nonlocal map_size
        assert env is not None
        while True:
            try:
                with env.begin(write=True) as txn:
                    for key, value in pending:
                        txn.put(key, value)
                break
            except lmdb.MapFullError:
                map_size *= 2  # the aborted transaction is replayed on the larger map
                env.set_mapsize(map_size)
        pending.clear()

    published = False
    count = fed_bytes = 0
    try:
        env = lmdb.open(tmp, map_size=map_size, subdir=True, meminit=False, map_async=True)
        for i, data, label in records:
            crcs[i], labels[i] = zlib.crc32(data), label
            pending.append((keys[i], data))
            count, fed_bytes = count + 1, fed_bytes + len(data)
            if len(pending) >= COMMIT_EVERY:
                commit()
        if count != n:
            raise RuntimeError(f"expected {n} records, got {count}")
        meta = pack_meta(StringArray(keys), labels, list(classes or []), verified, verified_by)
        pending.append((META_KEY, meta))
        commit()
        env.sync(True)
        env.close()
        publish(tmp, dst, overwrite)
        published = True
    except (OSError, lmdb.Error) as e:
        if env is not None:
            env.close()  # its file stays allocated while open
        full = no_space(e, tmp, dst, fed_bytes, count, n)
        if full is not None:
            raise full from e
        raise
    finally:
        if env is not None:
            env.close()
        if not published:
            discard(tmp)
    return crcs


def write_tfrecord(
    records: Records,
    dst: str,
    n: int,
    shards: int,
    classes: Sequence[str] | None,
    names: Callable[[int], str] | None = None,
    prefix: str = "data",
    overwrite: bool = False,
    *,
    verified: np.ndarray | None = None,
    verified_by: str = "",
) -> np.ndarray:
    """Writes ``shards`` TFRecord files, their ``.idx`` indexes and a metadata sidecar into folder ``dst``.

    The sidecar ``<prefix>.fastload.json`` holds the class names and each shard's record
    count; each record also names its class in ``image/class/synset`` and ``image/class/text``.
    ``verified``: per record, the CRC32C of its image where a strict decode accepted it, else
    NOT_VERIFIED, set by the time the record arrives: the sidecar's ``verified`` section then
    gets, with ``verified_by``, the CRC32C of each such record's data (the serialized Example,
    as its frame holds it masked; NOT_VERIFIED for the others).
    """
    if shards < 1 or shards > n:
        raise ValueError(f"--shards must be between 1 and the {n} records, got {shards}")
    tmp = stage(dst, overwrite)
    bounds = [round(k * n / shards) for k in range(shards + 1)]
    crcs = np.zeros(n, np.uint32)
    counts: dict[str, int] = {}
    unsized: list[str] = []
    shard, out, index = -1, None, None
    checked: dict[str, list[int]] = {}  # shard name → its records' data CRC32C where verified
    published = False
    fed = fed_bytes = 0
    try:
        for i, data, label in records:
            fed, fed_bytes = fed + 1, fed_bytes + len(data)
            while i >= bounds[shard + 1]:
                if out is not None and index is not None:
                    out.close()
                    index.close()
                shard += 1
                shard_name = f"{prefix}-{shard:05d}-of-{shards:05d}"
                counts[shard_name] = bounds[shard + 1] - bounds[shard]
                checked[shard_name] = []
                out = open(os.path.join(tmp, shard_name), "wb")
                index = open(os.path.join(tmp, shard_name + INDEX_SUFFIX), "w")
            crcs[i] = zlib.crc32(data)
            class_name = classes[label] if classes and 0 <= label < len(classes) else None
            name = names(i) if names is not None else str(i)
            try:
                size = image_size(data)
            except DecodeError as e:  # bytes are copied as they are; --verify reports them
                size = (0, 0)
                unsized.append(f"index {i} ({name}): {e}")
            example = make_example(data, label, name, class_name, size, b"JPEG" if is_jpeg(data) else b"PNG")
            crc = None
            if verified is not None:  # the CRC the frame needs anyway, computed once
                crc = crc32c(example)
                checked[shard_name].append(crc if verified[i] != NOT_VERIFIED else NOT_VERIFIED)
            record = frame(example, crc)
            assert out is not None and index is not None  # opened by the loop above (bounds[0] == 0)
            index.write(f"{out.tell()} {len(record)}\n")
            out.write(record)
        if out is not None and index is not None:
            out.close()
            index.close()
            out = index = None
        section = None if verified is None else verified_section(verified_by, OF_RECORD_DATA, checked)
        write_meta(tmp, prefix, classes, counts, section)
        publish(tmp, dst, overwrite)
        published = True
        if unsized:
            warnings.warn(
                f"fastload: {len(unsized)} image(s) have no readable size (image/height and "
                f"image/width written as 0), first {unsized[0]}",
                RuntimeWarning,
                stacklevel=3,
            )
    except OSError as e:
        close_quietly(out, index)  # a buffered write fails again on close; the space returns only then
        out = index = None
        full = no_space(e, tmp, dst, fed_bytes, fed, n)
        if full is not None:
            raise full from e
        raise
    finally:
        close_quietly(out, index)
        if not published:
            discard(tmp)
    return crcs
