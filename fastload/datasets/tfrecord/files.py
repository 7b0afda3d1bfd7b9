"""Which files a TFRecord dataset is: paths, globs and folders, shard sets, metadata sidecars."""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..partial import check_complete, explain_missing
from ..verified_sidecar import OF_RECORD_DATA, SECTION, parse_verified

INDEX_SUFFIX = ".idx"
META_SUFFIX = ".fastload.json"
# Files beside the shards that are never records themselves.
SIDE_SUFFIXES = (INDEX_SUFFIX, ".index", ".json")
# TensorFlow's shard names: train-00002-of-01024, optionally with a suffix (.gz, .tfrecord).
SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<k>\d+)-of-(?P<n>\d+)(?P<suffix>\.[^-]*)?$")
_MAX_META_BYTES = 64 << 20


def record_files(folder: str) -> list[str]:
    """The record files of ``folder``: regular, not hidden, not an index or sidecar."""
    return sorted(
        e.path
        for e in os.scandir(folder)
        if e.is_file() and not e.name.startswith(".") and not e.name.endswith(SIDE_SUFFIXES)
    )


def expand_paths(paths_or_glob: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Files named by a path, a glob, a folder of record files, or a list of those.

    Files found through a folder or glob whose names follow ``*-NNNNN-of-MMMMM`` must be
    complete sets; files named one by one are taken as given.

    Raises:
        FileNotFoundError: A path does not exist or a glob matches nothing.
        ValueError: A shard set is incomplete, or a folder is an unfinished conversion.
    """
    items = [paths_or_glob] if isinstance(paths_or_glob, (str, os.PathLike)) else list(paths_or_glob)
    files: list[str] = []
    for item in map(os.fspath, items):
        if os.path.isdir(item):
            check_complete(item)
            found = record_files(item)
        elif any(c in item for c in "*?["):
            found = sorted(f for f in glob.glob(item) if os.path.isfile(f) and not f.endswith(SIDE_SUFFIXES))
            for folder in sorted({os.path.dirname(f) or "." for f in found}):
                check_complete(folder)
        else:
            if not os.path.isfile(item):
                raise FileNotFoundError(f"TFRecord file {item!r} does not exist{explain_missing(item)}")
            check_complete(os.path.dirname(item) or ".")
            files.append(item)
            continue
        if not found:
            raise FileNotFoundError(f"no TFRecord files match {item!r}{explain_missing(item)}")
        check_shard_sets(found, item)
        files.extend(found)
    return files


def _shard_groups(files: Sequence[str]) -> dict[tuple[str, str, str, str], dict[int, str]]:
    groups: dict[tuple[str, str, str, str], dict[int, str]] = {}
    for path in files:
        m = SHARD_NAME.match(os.path.basename(path))
        if m:
            key = (os.path.dirname(path), m["stem"], m["n"], m["suffix"] or "")
            groups.setdefault(key, {})[int(m["k"])] = path
    return groups


def check_shard_sets(files: Sequence[str], where: str) -> None:
    """Raises ValueError unless every ``*-NNNNN-of-MMMMM`` set in ``files`` has all MMMMM shards."""
    for (folder, stem, n_text, suffix), shards in _shard_groups(files).items():
        n = int(n_text)
        beyond = sorted(k for k in shards if k >= n)
        if beyond:
            raise ValueError(f"{shards[beyond[0]]}: shard number {beyond[0]} is not below the shard count {n}")
        missing = [k for k in range(n) if k not in shards]
        if missing:
            names = [f"{stem}-{k:0{len(n_text)}d}-of-{n_text}{suffix}" for k in missing]
            shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
            raise ValueError(
                f"{where}: {len(missing)} of the {n} shards {stem}-*-of-{n_text}{suffix} are missing "
                f"in {folder or '.'}: {shown} (an incomplete copy or conversion?); to read "
                "a subset on purpose, pass the files as a list"
            )


def meta_path(folder: str, stem: str) -> str:
    """The metadata sidecar of the shard set ``stem-*`` in ``folder``."""
    return os.path.join(folder, stem + META_SUFFIX)


def write_meta(
    folder: str, stem: str, classes: Sequence[str] | None, records: dict[str, int], verified: dict | None = None
) -> None:
    """Writes the sidecar: class names and each shard's record count, as plain JSON; with
    ``verified``, the checksums of a strict verification
    (:func:`~fastload.datasets.verified_sidecar.verified_section`)."""
    meta = {"format": "fastload-tfrecord", "version": 1, "classes": list(classes or []), "records": records}
    if verified is not None:
        meta[SECTION] = verified
    with open(meta_path(folder, stem), "w", encoding="utf-8") as f:
        json.dump(meta, f)


@dataclass
class Meta:
    """What the sidecars of a set of files say.

    Attributes:
        classes: Class names, None when no sidecar has them.
        counts: {file path: expected record count}.
        verified_by: Who verified the records ("fastload VERSION, strict, DECODER"), or "".
        verified: {file path: per-record CRC32C of its data, NOT_VERIFIED where not verified}.
    """

    classes: list[str] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    verified_by: str = ""
    verified: dict[str, np.ndarray] = field(default_factory=dict)


def read_meta(files: Sequence[str]) -> tuple[list[str] | None, dict[str, int]]:
    """Class names and per-file record counts from the sidecars of ``files``' shard sets.

    Returns:
        (classes or None when no sidecar has them, {file path: expected record count}).

    Raises:
        ValueError: A sidecar is malformed, or two disagree on the classes.
    """
    meta = load_meta(files)
    return meta.classes, meta.counts


def load_meta(files: Sequence[str]) -> Meta:
    """Everything the sidecars of ``files``' shard sets say (see :class:`Meta`).

    Raises:
        ValueError: A sidecar is malformed, or two disagree on the classes.
    """
    out = Meta()
    for folder, stem, _, _ in sorted(_shard_groups(files)):
        path = meta_path(folder, stem)
        if not os.path.isfile(path):
            continue
        if os.path.getsize(path) > _MAX_META_BYTES:
            raise ValueError(f"{path}: {os.path.getsize(path)} bytes is too large for a metadata sidecar")
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: not a fastload metadata sidecar: {e}") from e
        names = meta.get("classes") if isinstance(meta, dict) else None
        records = meta.get("records", {}) if isinstance(meta, dict) else None
        if not (
            isinstance(names, list)
            and all(isinstance(c, str) for c in names)
            and isinstance(records, dict)
            and all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in records.items())
        ):
            raise ValueError(
                f"{path}: a metadata sidecar needs 'classes' (a list of strings) and 'records' (shard name → count)"
            )
        if names:
            if out.classes is not None and out.classes != names:
                raise ValueError(f"{path}: class names differ from another shard set's")
            out.classes = names
        out.counts.update({os.path.join(folder, name): n for name, n in records.items()})
        by, verified = parse_verified(meta, path, OF_RECORD_DATA, records)
        if verified:
            out.verified_by = out.verified_by or by
            out.verified.update({os.path.join(folder, name): crcs for name, crcs in verified.items()})
    return out
