"""Other tools' LMDBs: which keys are samples, and pickled (bytes, label) values (opt-in only).

The common "folder2lmdb" scripts write samples under ``b'0'``, ``b'1'``, ... as pickled
``(image bytes, label)`` and two bookkeeping records beside them: ``b'__keys__'`` (the
pickled list of sample keys) and ``b'__len__'`` (their count). Those two are no samples.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .storage import StringArray

KEYS_RECORD = b"__keys__"
LEN_RECORD = b"__len__"
#: Keys LMDBDataset skips by default in a foreign LMDB: folder2lmdb's bookkeeping records.
DEFAULT_EXCLUDED = (KEYS_RECORD, LEN_RECORD)


def pickled_sample(value: Any) -> tuple[bytes, int]:
    """Parses pickled (image bytes, label) pairs or {"image"/"img": ..., "label": ...} dicts.

    Only used with ``allow_pickle=True``: unpickling runs code from the file.
    """
    obj = pickle.loads(bytes(value))
    if isinstance(obj, dict):
        image = next((obj[k] for k in ("image", "img", "jpeg", "data") if k in obj), None)
        label = next((obj[k] for k in ("label", "target", "class") if k in obj), None)
    elif isinstance(obj, (tuple, list)) and len(obj) == 2:
        image, label = obj
    else:
        raise ValueError(
            f"unpickled a {type(obj).__name__}; pass parse= to read this layout, and "
            "exclude_keys= to skip keys that are not samples"
        )
    if image is None or label is None:
        raise ValueError(f"pickled dict has keys {sorted(obj)}; pass parse= to read this layout")
    return bytes(image), int(label)


def as_key_set(keys: Iterable[bytes | str] | None, name: str = "exclude_keys") -> frozenset[bytes]:
    """``keys`` (bytes, or str taken as UTF-8) as a set of bytes.

    Raises:
        TypeError: ``keys`` is a single str/bytes, or holds something else.
    """
    if keys is None:
        return frozenset()
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{name} must be a collection of keys, got the single key {keys!r}; wrap it in a list")
    out = set()
    for key in keys:
        if isinstance(key, str):
            key = key.encode()
        if not isinstance(key, bytes):
            raise TypeError(f"{name} must hold bytes or str keys, got {key!r} ({type(key).__name__})")
        out.add(key)
    return frozenset(out)


def listed_keys(get: Callable[[bytes], Any], path: str, allow_pickle: bool) -> list[bytes] | None:
    """The sample keys a folder2lmdb ``__keys__`` record lists (None without one, or
    without ``allow_pickle``: that record is pickled too, so it is then only skipped).

    Raises:
        ValueError: The record is not a list of keys, or ``__len__`` disagrees with it.
    """
    raw = get(KEYS_RECORD)
    if raw is None or not allow_pickle:
        return None
    keys = pickle.loads(bytes(raw))
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, (bytes, str)) for k in keys):
        raise ValueError(
            f"{path}: {KEYS_RECORD!r} is not a list of keys ({type(keys).__name__}); pass "
            f"exclude_keys=[{KEYS_RECORD!r}, ...] to read every other key as a sample"
        )
    keys = [k.encode() if isinstance(k, str) else k for k in keys]
    raw_len = get(LEN_RECORD)
    if raw_len is not None:
        count = pickle.loads(bytes(raw_len))
        if isinstance(count, int) and count != len(keys):
            raise ValueError(f"{path}: {LEN_RECORD!r} says {count} samples but {KEYS_RECORD!r} lists {len(keys)}")
    return keys


def scan(
    get: Callable[[bytes], Any],
    items: Callable[[], Iterable[tuple[Any, Any]]],
    total: int,
    path: str,
    parse: Callable[[Any], tuple[Any, int]],
    keys: list[bytes] | None,
    excluded: frozenset[bytes],
) -> tuple[StringArray, np.ndarray]:
    """(keys, labels) of the samples (values read by ``get(key)``, or all by ``items()``,
    ``total`` of them when known, else 0): those listed in ``keys`` (in that order, less the
    ``excluded``), else every key but the ``excluded`` ones (in key order), each value run
    through ``parse``.

    Raises:
        ValueError: ``parse`` fails on a value (names its key), or a listed key is missing.
    """
    from tqdm import tqdm

    out: list[bytes] = []
    labels: list[int] = []

    def add(key: bytes, value: Any) -> None:
        try:
            _, label = parse(value)
        except Exception as e:
            raise ValueError(
                f"{path}: parse failed on key {key!r}: {e}; if that key is not a sample, "
                "pass exclude_keys=[...] naming it"
            ) from e
        out.append(key)
        labels.append(int(label))

    if keys is not None:
        for key in tqdm(keys, desc=f"indexing {path}", unit="rec", disable=len(keys) < 100_000):
            if key in excluded:
                continue
            value = get(key)
            if value is None:
                raise ValueError(f"{path}: key {key!r} listed in {KEYS_RECORD!r} is missing")
            add(key, value)
    else:
        for key, value in tqdm(
            items(), total=total or None, desc=f"indexing {path}", unit="rec", disable=total < 100_000
        ):
            key = bytes(key)
            if key not in excluded:
                add(key, value)
    return StringArray(out), np.asarray(labels, dtype=np.int64)
