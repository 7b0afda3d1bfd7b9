"""A shard's index: its members grouped into samples by key, stored as plain arrays (.npz, no pickle).

WebDataset's layout: a member ``dir/key.ext.more`` belongs to sample ``dir/key`` (the
name up to the first dot of its last part) with extension ``ext.more`` (lower-cased);
the members with one key form one sample, adjacent or not (archives made by ``tar cf``
are in directory order); names like ``__meta__`` are skipped.
An index names, per member, its sample, extension, data offset and size, so any
sample's bytes can be read from the shard (or a download of it) directly.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .tar import Member, ShardError

FORMAT_VERSION = 3  # 2: samples grouped by key over the whole archive; 3: a sample cut in its first member its own
UNVALIDATED = "unvalidated:"
GZIP_SUFFIXES = (".tar.gz", ".tgz")
_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


@dataclass(frozen=True)
class ShardId:
    """What a shard's content is known by: its URL (or absolute path), size and version
    (ETag or Last-Modified of an object, mtime of a local file)."""

    url: str
    size: int
    version: str

    @property
    def gzipped(self) -> bool:
        """A gzip-compressed tar (``.tar.gz``, ``.tgz``): read by decompressing it as it streams."""
        return self.url.lower().endswith(GZIP_SUFFIXES)

    @property
    def validated(self) -> bool:
        """Whether ``version`` tells contents apart (False: the server sent no ETag or
        Last-Modified, and the version is one dataset's own token)."""
        return not self.version.startswith(UNVALIDATED)

    def digest(self) -> str:
        """A file-name-safe key for caches."""
        return hashlib.sha256(
            f"{self.url}\0{self.size}\0{self.version}".encode("utf-8", "surrogateescape")
        ).hexdigest()[:32]


@dataclass(frozen=True)
class ShardIndex:
    """The samples of one shard.

    Attributes:
        keys: One per sample, in shard order.
        exts: The extensions that occur (``member_ext`` indexes them).
        member_sample, member_ext, member_offset, member_size: One row per member.
        broken_offset: Where the archive breaks (-1: it does not); the last sample is
            then incomplete and every read of it fails with ``broken``.
        broken: The problem at ``broken_offset`` ("" when none).
    """

    keys: list[str]
    exts: list[str]
    member_sample: np.ndarray
    member_ext: np.ndarray
    member_offset: np.ndarray
    member_size: np.ndarray
    broken_offset: int = -1
    broken: str = ""

    def __len__(self) -> int:
        return len(self.keys)


def split_name(name: str) -> tuple[str, str] | None:
    """(sample key, lower-case extension) of a member name, or None for names that are no sample's."""
    if _META.match(name):
        return None
    m = _NAME.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


def group_members(members: Iterable[Member], url: str) -> ShardIndex:
    """Groups ``members`` into samples by key; a ShardError while reading them marks the index broken.

    Members of one key are one sample wherever they are in the archive: ``tar cf`` writes
    files in directory order, so a sample's members need not be adjacent. Samples are
    numbered in the order their first member comes; in a broken archive the sample of the
    member it breaks in (or, when that is not known, of the last member read) is numbered
    last: it is the one cut off.

    Raises:
        ShardError: One sample holds two members with the same extension.
    """
    key_ids: dict[str, int] = {}
    ext_ids: dict[str, int] = {}
    rows: list[tuple[int, int, int, int]] = []
    seen: set[tuple[int, int]] = set()
    broken_offset, broken, cut = -1, "", -1
    it = iter(members)
    while True:
        try:
            member = next(it)
        except StopIteration:
            break
        except ShardError as e:
            if not key_ids:  # nothing readable at all: not a shard
                raise
            broken_offset, broken = (e.offset if e.offset is not None else 0), e.problem
            parts = split_name(e.member) if e.member else None
            # the sample of the member it broke in (a sample of its own when that member was
            # its first: the sample before is whole); when not known, the last one read
            cut = key_ids.setdefault(parts[0], len(key_ids)) if parts is not None else rows[-1][0] if rows else -1
            break
        parts = split_name(member.name)
        if parts is None:
            continue
        key, ext = parts
        sample, kind = key_ids.setdefault(key, len(key_ids)), ext_ids.setdefault(ext, len(ext_ids))
        if (sample, kind) in seen:
            raise ShardError(url, member.offset, f"sample {key!r} has two members with extension {ext!r}")
        seen.add((sample, kind))
        rows.append((sample, kind, member.offset, member.size))
    keys = list(key_ids)
    table = np.asarray(rows, np.int64).reshape(-1, 4)
    if cut >= 0 and cut != len(keys) - 1:  # renumber: the cut-off sample last, the others keep their order
        order = [k for k in range(len(keys)) if k != cut] + [cut]
        renumber = np.empty(len(keys), np.int64)
        renumber[order] = np.arange(len(keys))
        table[:, 0] = renumber[table[:, 0]]
        keys = [keys[k] for k in order]
    table = table[np.argsort(table[:, 0], kind="stable")]  # rows grouped by sample, archive order within
    return ShardIndex(
        keys,
        list(ext_ids),
        table[:, 0].astype(np.int32),
        table[:, 1].astype(np.int16),
        table[:, 2].copy(),
        table[:, 3].copy(),
        broken_offset,
        broken,
    )


def _pack(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), offsets


def _unpack(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    raw = data.tobytes()
    return [raw[a:b].decode("utf-8", "surrogateescape") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def save_index(path: str, index: ShardIndex, shard: ShardId) -> None:
    """Writes ``index`` atomically (a temporary file renamed into place)."""
    keys_data, keys_offsets = _pack(index.keys)
    exts_data, exts_offsets = _pack(index.exts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}.npz"
    np.savez(
        tmp,
        version=np.int64(FORMAT_VERSION),
        size=np.int64(shard.size),
        keys_data=keys_data,
        keys_offsets=keys_offsets,
        exts_data=exts_data,
        exts_offsets=exts_offsets,
        member_sample=index.member_sample,
        member_ext=index.member_ext,
        member_offset=index.member_offset,
        member_size=index.member_size,
        broken_offset=np.int64(index.broken_offset),
        broken=np.frombuffer(index.broken.encode(), np.uint8),
    )
    os.replace(tmp, path)


def load_index(path: str, shard: ShardId) -> ShardIndex | None:
    """The index stored at ``path`` if it is a consistent one of a shard of ``shard.size`` bytes, else None."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != FORMAT_VERSION or int(z["size"]) != shard.size:
                return None
            keys, exts = _unpack(z["keys_data"], z["keys_offsets"]), _unpack(z["exts_data"], z["exts_offsets"])
            index = ShardIndex(
                keys,
                exts,
                z["member_sample"].astype(np.int32),
                z["member_ext"].astype(np.int16),
                z["member_offset"].astype(np.int64),
                z["member_size"].astype(np.int64),
                int(z["broken_offset"]),
                z["broken"].tobytes().decode(),
            )
    except (OSError, KeyError, ValueError, TypeError):
        return None
    rows = {len(a) for a in (index.member_sample, index.member_ext, index.member_offset, index.member_size)}
    sample, size = index.member_sample, shard.size
    ok = len(rows) == 1 and (
        not len(sample)
        or (
            sample.min() >= 0
            and sample.max() < len(keys)
            and np.all(np.diff(sample) >= 0)
            and index.member_ext.min() >= 0
            and index.member_ext.max() < len(exts)
            and index.member_offset.min() >= 0
            and index.member_size.min() >= 0
            and (shard.gzipped or np.all(index.member_offset + index.member_size <= size))
        )
    )
    return index if ok else None
