"""What of a dataset its worker processes copied when they started, to find a change they
would not see.

Worker processes load from their own copy of the dataset, made as they start (forked, or
pickled for spawn). Persistent workers keep that copy across epochs, so a change the
program makes between epochs (a new ``transform`` for progressive resizing, an attribute
set by the dataset's own ``set_epoch``) would never reach them, silently: torch's
DataLoader behaves so, and ``fl.Loader`` keeps its workers by default. :func:`snapshot`
records the dataset as its workers start; :func:`changed` names what differs as the next
pass starts, and the runner starts new workers, which copy the dataset as it is now.

What counts: every public attribute (no leading underscore) of the dataset, and of the
datasets it holds (a ``Subset``'s) or that hold it (the wrapper a Loader makes, which holds
the Loader's ``transform``): one set to another object, added or removed; for attributes
named ``*transform*``, also a change inside the object (its pickled bytes differ), as in
``ds.transform.size = 160``. Private attributes are the dataset's own caches and handles
(an LMDB environment opened lazily), which may differ per process by design. A change
inside any other object (an element of a list replaced in place) is not seen.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Any

import torch

#: Values compared by equality (immutable, cheap to compare); every other one by identity.
_PLAIN = (bool, int, float, complex, str, bytes, type(None))

#: Datasets held inside datasets are looked into this deep (a Loader's wrapper of a
#: ``Subset`` of the user's dataset is 3).
_DEPTH = 4


@dataclass(frozen=True)
class Snapshot:
    """Datasets' public attributes as their workers started, by root and path (``transform``;
    ``dataset.transform`` for one of a dataset held inside): each value (plain values) or the
    object itself (held, so that its identity cannot be reused), and for transforms the
    digest of their pickled bytes (None where they do not pickle)."""

    entries: dict[tuple[int, str], tuple[Any, bytes | None]]


def snapshot(*roots: Any) -> Snapshot:
    """The public attributes of ``roots`` and of the datasets they hold, as now; a dataset
    met twice counts once, under the first root that holds it (the user's dataset first, then
    the wrapper a Loader made of it: paths read as the user's)."""
    entries: dict[tuple[int, str], tuple[Any, bytes | None]] = {}
    seen: set[int] = set()
    for k, root in enumerate(roots):
        _walk(root, k, "", entries, 0, seen)
    return Snapshot(entries)


def changed(before: Snapshot, *roots: Any) -> list[str]:
    """The attribute paths of ``roots`` that differ from ``before`` (set to another object,
    added, removed, or a transform changed inside), sorted; empty where none does."""
    now = snapshot(*roots).entries
    moved = []
    for key in sorted(before.entries.keys() | now.keys()):
        path = key[1]
        if key not in before.entries or key not in now:
            moved.append(path)
            continue
        (old, old_digest), (new, new_digest) = before.entries[key], now[key]
        same = old is new or (isinstance(old, _PLAIN) and isinstance(new, _PLAIN) and old == new)
        if not same or old_digest != new_digest:
            moved.append(path)
    return sorted(set(moved))


def _walk(obj: Any, root: int, prefix: str, entries: dict, depth: int, seen: set[int]) -> None:
    if id(obj) in seen or depth > _DEPTH:
        return
    seen.add(id(obj))
    try:
        attrs = vars(obj)
    except TypeError:  # no __dict__ (slots, a C type): nothing public to compare
        return
    for name, value in list(attrs.items()):
        if not isinstance(name, str) or name.startswith("_"):
            continue
        path = prefix + name
        if isinstance(value, torch.utils.data.Dataset) and id(value) in seen:
            continue  # counted under an earlier root (the user's dataset inside a Loader's wrapper)
        entries[root, path] = (value, _digest(value) if "transform" in name.lower() else None)
        if isinstance(value, torch.utils.data.Dataset):
            _walk(value, root, path + ".", entries, depth + 1, seen)


def _digest(value: Any) -> bytes | None:
    """The digest of ``value``'s pickled bytes; None where it does not pickle (a lambda)."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - any object's own __reduce__ may raise anything
        return None
    return hashlib.blake2b(data, digest_size=16).digest()
