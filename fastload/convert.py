"""Convert any dataset fastload reads into fastload's LMDB layout or TFRecord shards.

Output is written under a temporary name and renamed at the end, so an interrupted run
never leaves something that looks complete. Used by ``tools/*.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from tqdm import tqdm

from .datasets.lmdb_dataset import META_KEY, pack_meta
from .datasets.open import open_dataset
from .datasets.tfrecord_dataset import INDEX_SUFFIX, TFRecordDataset, example_pb2, masked_crc
from .decode import decode_image, image_size, is_jpeg
from .storage import StringArray

COMMIT_EVERY = 2000
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


def read_all(source: Any, workers: int, resize_shorter: int | None, quality: int | None,
             desc: str, progress: bool) -> Iterator[tuple[int, bytes, int]]:
    """(index, encoded bytes, label) in index order, read by ``workers`` threads."""

    def fetch(i: int) -> tuple[int, bytes, int]:
        data, label = source.read(i)
        data = bytes(data)
        if resize_shorter or quality:
            data = reencode(data, resize_shorter, quality or 90)
        return i, data, label

    n = len(source)
    with ThreadPoolExecutor(max(1, workers)) as pool, tqdm(total=n, desc=desc, unit="img", disable=not progress) as bar:
        for start in range(0, n, CHUNK):
            for item in pool.map(fetch, range(start, min(n, start + CHUNK))):
                yield item
                bar.update(1)


def _partial(dst: str, overwrite: bool) -> str:
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst} exists; pass --overwrite to replace it")
    tmp = f"{dst}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _publish(tmp: str, dst: str) -> None:
    if os.path.exists(dst):
        shutil.rmtree(dst) if os.path.isdir(dst) else os.remove(dst)
    os.rename(tmp, dst)


def write_lmdb(records: Iterator[tuple[int, bytes, int]], dst: str, n: int, classes: list[str] | None,
               overwrite: bool = False, map_size: int = 1 << 26) -> np.ndarray:
    """Writes fastload's LMDB layout; returns the crc32 of every record's bytes."""
    import lmdb

    tmp = _partial(dst, overwrite)
    env = lmdb.open(tmp, map_size=map_size, subdir=True, meminit=False, map_async=True)
    crcs = np.zeros(n, np.uint32)
    labels = np.zeros(n, np.int64)
    keys = [b"%09d" % i for i in range(n)]
    pending: list[tuple[bytes, bytes]] = []

    def commit() -> None:
        nonlocal map_size
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
    try:
        count = 0
        for i, data, label in records:
            crcs[i], labels[i] = zlib.crc32(data), label
            pending.append((keys[i], data))
            count += 1
            if len(pending) >= COMMIT_EVERY:
                commit()
        if count != n:
            raise RuntimeError(f"expected {n} records, got {count}")
        pending.append((META_KEY, pack_meta(StringArray(keys), labels, classes or [])))
        commit()
        env.sync(True)
        env.close()
        _publish(tmp, dst)
        published = True
    finally:
        env.close()
        if not published:
            shutil.rmtree(tmp, ignore_errors=True)
    return crcs


def tf_example(data: bytes, label: int, name: str, synset: str | None) -> bytes:
    """A tf.train.Example in the layout of TensorFlow's ImageNet build script."""
    pb = example_pb2()
    h, w = image_size(data)

    def b(v: bytes):
        return pb.Feature(bytes_list=pb.BytesList(value=[v]))

    def i(v: int):
        return pb.Feature(int64_list=pb.Int64List(value=[v]))

    feats = {"image/encoded": b(data), "image/format": b(b"JPEG" if is_jpeg(data) else b"PNG"),
             "image/class/label": i(label), "image/height": i(h), "image/width": i(w),
             "image/channels": i(3), "image/colorspace": b(b"RGB"), "image/filename": b(name.encode())}
    if synset is not None:
        feats["image/class/synset"] = b(synset.encode())
    return pb.Example(features=pb.Features(feature=feats)).SerializeToString()


def write_tfrecord(records: Iterator[tuple[int, bytes, int]], dst: str, n: int, shards: int,
                   classes: list[str] | None, names: Any = None, prefix: str = "data",
                   overwrite: bool = False) -> np.ndarray:
    """Writes ``shards`` TFRecord files plus ``.idx`` index files into folder ``dst``."""
    if shards < 1 or shards > n:
        raise ValueError(f"--shards must be between 1 and the {n} records, got {shards}")
    tmp = _partial(dst, overwrite)
    os.makedirs(tmp)
    bounds = [round(k * n / shards) for k in range(shards + 1)]
    crcs = np.zeros(n, np.uint32)
    shard, out, index = -1, None, None
    published = False
    try:
        for i, data, label in records:
            while i >= bounds[shard + 1]:
                if out is not None:
                    out.close()
                    index.close()
                shard += 1
                path = os.path.join(tmp, f"{prefix}-{shard:05d}-of-{shards:05d}")
                out, index = open(path, "wb"), open(path + INDEX_SUFFIX, "w")
            crcs[i] = zlib.crc32(data)
            name = names(i) if names is not None else str(i)
            record = tf_example(data, label, name, classes[label] if classes and 0 <= label < len(classes) else None)
            head = struct.pack("<Q", len(record))
            offset = out.tell()
            out.write(head + struct.pack("<I", masked_crc(head)) + record + struct.pack("<I", masked_crc(record)))
            index.write(f"{offset} {16 + len(record)}\n")
        out.close()
        index.close()
        _publish(tmp, dst)
        published = True
    finally:
        if out is not None:
            out.close()
            index.close()
        if not published:
            shutil.rmtree(tmp, ignore_errors=True)
    return crcs


def verify(dst: str, crcs: np.ndarray, labels: np.ndarray, progress: bool = True) -> None:
    """Reads ``dst`` back through fastload and checks count, labels and each record's crc32."""
    ds = open_dataset(dst)
    if len(ds) != len(crcs):
        raise ValueError(f"verify: {dst} has {len(ds)} records, expected {len(crcs)}")
    for i in tqdm(range(len(ds)), desc=f"verify {dst}", unit="img", disable=not progress):
        data, label = ds.read(i)
        if label != labels[i]:
            raise ValueError(f"verify: record {i} of {dst} has label {label}, expected {labels[i]}")
        if zlib.crc32(bytes(data)) != crcs[i]:
            raise ValueError(f"verify: record {i} of {dst} differs from the source (checksum)")


def convert(src: str, dst: str, fmt: str, *, shards: int = 1, workers: int = 4, resize_shorter: int | None = None,
            quality: int | None = None, verify_output: bool = False, overwrite: bool = False,
            progress: bool = True, **open_kwargs: Any) -> dict:
    """Converts dataset ``src`` (anything open_dataset reads) to ``fmt`` ("lmdb" or "tfrecord") at ``dst``.

    Returns:
        {"records", "seconds", "images_per_s", "bytes"}.
    """
    if fmt not in ("lmdb", "tfrecord"):
        raise ValueError(f"format must be 'lmdb' or 'tfrecord', got {fmt!r}")
    if quality is not None and not 1 <= quality <= 100:
        raise ValueError(f"--quality must be in 1..100, got {quality}")
    if resize_shorter is not None and resize_shorter < 1:
        raise ValueError(f"--resize-shorter must be positive, got {resize_shorter}")
    source = open_dataset(src, **open_kwargs)
    if not hasattr(source, "read"):
        raise ValueError(f"{src} is a compressed stream; decompress it to convert")
    n = len(source)
    classes = getattr(source, "classes", None)
    labels = source.labels.copy() if not isinstance(source, TFRecordDataset) else None
    start = time.perf_counter()
    records = read_all(source, workers, resize_shorter, quality, f"{os.path.basename(src)} → {fmt}", progress)
    if labels is None:  # TFRecord labels are only known while reading
        got = np.zeros(n, np.int64)

        def record_labels(it):
            for i, data, label in it:
                got[i] = label
                yield i, data, label

        records = record_labels(records)
    if fmt == "lmdb":
        crcs = write_lmdb(records, dst, n, classes, overwrite)
    else:
        names = getattr(source, "paths", None)
        crcs = write_tfrecord(records, dst, n, shards, classes, names.__getitem__ if names is not None else None,
                              overwrite=overwrite)
    seconds = time.perf_counter() - start
    if labels is None:
        labels = got
    if verify_output:
        verify(dst, crcs, labels, progress)
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(dst) for f in fs)
    return {"records": n, "seconds": seconds, "images_per_s": n / seconds, "bytes": size}


def main(fmt: str, argv: list[str] | None = None, description: str = "") -> int:
    """Command line shared by tools/*.py."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("src", help="image folder, list file, LMDB or TFRecord file(s)/glob")
    p.add_argument("dst", help="output LMDB directory" if fmt == "lmdb" else "output folder for the shards")
    if fmt == "tfrecord":
        p.add_argument("--shards", type=int, default=1, help="number of TFRecord files (default: %(default)s)")
    p.add_argument("--workers", type=int, default=4, help="parallel readers (default: %(default)s)")
    p.add_argument("--resize-shorter", type=int, default=None, metavar="S", help="re-encode with shorter side <= S")
    p.add_argument("--quality", type=int, default=None, metavar="Q", help="re-encode as JPEG at quality Q")
    p.add_argument("--root", default=None, help="root of the paths in a list file")
    p.add_argument("--verify", action="store_true", help="read everything back and check it")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    args = p.parse_args(argv)
    kwargs = {"root": args.root} if args.root else {}
    try:
        stats = convert(args.src, args.dst, fmt, shards=getattr(args, "shards", 1), workers=args.workers,
                        resize_shorter=args.resize_shorter, quality=args.quality, verify_output=args.verify,
                        overwrite=args.overwrite, **kwargs)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    print(f"wrote {stats['records']} records to {args.dst} ({stats['bytes'] / 1e6:.1f} MB) in "
          f"{stats['seconds']:.1f} s: {stats['images_per_s']:.0f} images/s" + (", verified" if args.verify else ""))
    return 0
