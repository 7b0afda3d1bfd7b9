"""Other tools' LMDBs: which keys are samples, and how a value becomes (image bytes, label).

Two ways to know the samples:

- **a keys list**: the common "folder2lmdb" layout (keys ``b'0'``, ``b'1'``, ... holding
  pickled ``(image bytes, label)``, plus ``b'__len__'`` and ``b'__keys__'``, a pickled list
  of the sample keys). With ``allow_pickle=True`` the list says which keys are samples,
  in its order, and only those are read.
- **every key**, in key order, except ``exclude_keys``: by default the keys that begin and
  end with ``__`` (``__len__``, ``__keys__``, ``__meta__``: metadata in every layout seen).

Unpickling runs code from the file, so it happens only with ``allow_pickle=True``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

KEYS_KEY, LEN_KEY = b"__keys__", b"__len__"


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
        raise ValueError(f"unpickled a {type(obj).__name__}; pass parse= to read this layout")
    if image is None or label is None:
        raise ValueError(f"pickled dict has keys {sorted(obj)}; pass parse= to read this layout")
    return bytes(image), int(label)


def as_key_set(keys: Iterable[bytes | str] | None) -> frozenset[bytes] | None:
    """``exclude_keys`` as bytes (str keys are UTF-8); None stays None (the default rule).

    Raises:
        TypeError: A key is neither bytes nor str.
    """
    if keys is None:
        return None
    if isinstance(keys, (bytes, str)):
        keys = [keys]
    out = set()
    for key in keys:
        if isinstance(key, str):
            key = key.encode()
        if not isinstance(key, bytes):
            raise TypeError(f"exclude_keys must hold bytes or str keys, got {type(key).__name__} {key!r:.40}")
        out.add(key)
    return frozenset(out)


def excluded(key: bytes, exclude: frozenset[bytes] | None) -> bool:
    if exclude is None:
        return len(key) > 4 and key.startswith(b"__") and key.endswith(b"__")
    return key in exclude


def listed_keys(raw: bytes | None, path: str) -> list[bytes] | None:
    """The sample keys a ``__keys__`` record lists (unpickled: call only with allow_pickle), or None.

    Raises:
        ValueError: The record is not a list of bytes or str keys.
    """
    if raw is None:
        return None
    try:
        keys = pickle.loads(raw)
    except Exception as e:
        raise ValueError(f"{path}: its {KEYS_KEY!r} record does not unpickle: {e}") from e
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, (bytes, str)) for k in keys):
        raise ValueError(f"{path}: its {KEYS_KEY!r} record is a {type(keys).__name__}, not a list of keys")
    return [k.encode() if isinstance(k, str) else bytes(k) for k in keys]


def scan(records: Iterator[tuple[bytes, Any]], parse: Callable[[Any], tuple[Any, int]], path: str,
         exclude: frozenset[bytes] | None) -> tuple[list[bytes], list[int]]:
    """(keys, labels) of the samples among ``records`` (key, value): those not excluded.

    Raises:
        ValueError: ``parse`` failed on a value (naming its key).
    """
    keys: list[bytes] = []
    labels: list[int] = []
    for key, value in records:
        if excluded(bytes(key), exclude):
            continue
        try:
            _, label = parse(value)
        except Exception as e:
            raise ValueError(f"{path}: parse failed on key {bytes(key)!r}: {e} (exclude_keys= leaves out keys "
                             "that are not samples)") from e
        keys.append(bytes(key))
        labels.append(int(label))
    return keys, labels
