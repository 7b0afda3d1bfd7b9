"""open_dataset: recognise an image folder, list file, LMDB, TFRecord files or tar shards by content."""

from __future__ import annotations

import os
import struct
from typing import Any

from .folder import IMG_EXTENSIONS, ImageFolder, ImageList
from .lmdb_dataset import LMDBDataset
from .partial import check_complete, explain_missing
from .tfrecord import TFRecordDataset, TFRecordStream, expand_paths, masked_crc, record_files
from .webdataset import ShardError, WebDataset
from .webdataset.index import GZIP_SUFFIXES
from .webdataset.remote import is_url
from .webdataset.tar import BLOCK, ZERO_BLOCK, check_header
from .webdataset.urls import SHARD_SUFFIXES


def looks_like_tfrecord(path: str) -> bool:
    """True when the file starts with a TFRecord length whose CRC checks out."""
    try:
        if path.endswith(".gz"):
            import gzip

            with gzip.open(path, "rb") as f:
                head = f.read(12)
        else:
            with open(path, "rb") as f:
                head = f.read(12)
    except OSError:
        return False
    return len(head) == 12 and masked_crc(head[:8]) == struct.unpack_from("<I", head, 8)[0]


def looks_like_tar(path: str) -> bool:
    """True when the file (decompressed, for ``.tar.gz``/``.tgz``) starts with a tar header
    whose checksum checks out."""
    try:
        if path.lower().endswith(GZIP_SUFFIXES):
            import gzip

            with gzip.open(path, "rb") as f:
                head = f.read(BLOCK)
        else:
            with open(path, "rb") as f:
                head = f.read(BLOCK)
        if len(head) < BLOCK or head == ZERO_BLOCK:
            return False
        check_header(head, path, 0)
    except (OSError, EOFError, ShardError):  # gzip's BadGzipFile is an OSError
        return False
    return True


def _is_lmdb(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "data.mdb")) or (os.path.isfile(path) and path.endswith(".mdb"))


def detect(path: str) -> str:
    """One of "lmdb", "tfrecord", "tfrecord-stream", "webdataset", "folder", "list"; ValueError if none."""
    if is_url(path) or "{" in path:
        return "webdataset"
    if any(c in path for c in "*?["):
        import glob

        if any(f.lower().endswith(SHARD_SUFFIXES) for f in glob.glob(path)):
            return "webdataset"
        files = expand_paths(path)
        return "tfrecord-stream" if any(f.endswith(".gz") for f in files) else "tfrecord"
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset {path!r} does not exist{explain_missing(path)}")
    if os.path.isdir(path):
        check_complete(path)
    if _is_lmdb(path):
        return "lmdb"
    if os.path.isdir(path):
        entries = [e for e in os.scandir(path) if not e.name.startswith(".")]
        if any(e.is_dir() for e in entries):
            return "folder"
        files = record_files(path)
        if files and all(f.lower().endswith(SHARD_SUFFIXES) and looks_like_tar(f) for f in files):
            return "webdataset"
        if files and all(looks_like_tfrecord(f) for f in files):
            return "tfrecord-stream" if any(f.endswith(".gz") for f in files) else "tfrecord"
        raise ValueError(
            f"{path!r} is a folder but not an image folder (no class subfolders), "
            "an LMDB (no data.mdb), a folder of TFRecord files or of tar shards"
        )
    if looks_like_tar(path):
        return "webdataset"
    if looks_like_tfrecord(path):
        return "tfrecord-stream" if path.endswith(".gz") else "tfrecord"
    if path.lower().endswith(IMG_EXTENSIONS):
        raise ValueError(f"{path!r} is a single image, not a dataset")
    return "list"


def open_dataset(path: str | os.PathLike | list, transform: Any = None, **kwargs: Any):
    """Opens ``path`` with the dataset class its content calls for.

    Args:
        path: An image folder, a list file, an LMDB directory, TFRecord file(s), tar shards
            (a file, folder, glob, brace pattern, ``http(s)://`` or ``s3://`` URL, or a list
            of these: :class:`~fastload.WebDataset`) or a glob.
        transform: Applied to each decoded image.
        **kwargs: Passed to the dataset class (e.g. ``label_offset`` for TFRecord).
    """
    if isinstance(path, (list, tuple)):
        return WebDataset(path, transform=transform, **kwargs)
    path = os.fspath(path)
    kind = detect(path)
    cls = {
        "lmdb": LMDBDataset,
        "tfrecord": TFRecordDataset,
        "tfrecord-stream": TFRecordStream,
        "webdataset": WebDataset,
        "folder": ImageFolder,
        "list": ImageList,
    }[kind]
    return cls(path, transform=transform, **kwargs)
