"""open_dataset: recognise an image folder, list file, LMDB or TFRecord files by content."""

from __future__ import annotations

import os
import struct
from typing import Any

from .folder import IMG_EXTENSIONS, ImageFolder, ImageList
from .lmdb_dataset import LMDBDataset
from .partial import check_complete, explain_missing
from .tfrecord import TFRecordDataset, TFRecordStream, expand_paths, masked_crc, record_files


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


def _is_lmdb(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "data.mdb")) or (
        os.path.isfile(path) and path.endswith(".mdb"))


def detect(path: str) -> str:
    """One of "lmdb", "tfrecord", "tfrecord-stream", "folder", "list"; ValueError if none."""
    if any(c in path for c in "*?["):
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
        if files and all(looks_like_tfrecord(f) for f in files):
            return "tfrecord-stream" if any(f.endswith(".gz") for f in files) else "tfrecord"
        raise ValueError(f"{path!r} is a folder but not an image folder (no class subfolders), "
                         "an LMDB (no data.mdb) or a folder of TFRecord files")
    if looks_like_tfrecord(path):
        return "tfrecord-stream" if path.endswith(".gz") else "tfrecord"
    if path.lower().endswith(IMG_EXTENSIONS):
        raise ValueError(f"{path!r} is a single image, not a dataset")
    return "list"


def open_dataset(path: str | os.PathLike, transform: Any = None, **kwargs: Any):
    """Opens ``path`` with the dataset class its content calls for.

    Args:
        path: An image folder, a list file, an LMDB directory, TFRecord file(s) or a glob.
        transform: Applied to each decoded image.
        **kwargs: Passed to the dataset class (e.g. ``label_offset`` for TFRecord).
    """
    path = os.fspath(path)
    kind = detect(path)
    cls = {"lmdb": LMDBDataset, "tfrecord": TFRecordDataset, "tfrecord-stream": TFRecordStream,
           "folder": ImageFolder, "list": ImageList}[kind]
    return cls(path, transform=transform, **kwargs)
