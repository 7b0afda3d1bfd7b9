"""What of a dataset its worker processes copied when they started, to find a change they
would not see.

Worker processes load from their own copy of the dataset, made as they start (forked, or
pickled for spawn). Persistent workers keep that copy across epochs, so a change the
program makes between epochs (a new ``transform`` for progressive resizing, an attribute
set by the dataset's own ``set_epoch``) would never reach them, silently: torch's
DataLoader behaves so, and ``fl.Loader`` keeps its workers by default. :func:`snapshot`
records the dataset as its workers started; :func:`changed` names what differs as the next
pass starts, and the runner starts new workers, which copy the dataset as it is now.

What counts, of the dataset and of the datasets it holds (as an attribute, or in a list or
tuple: a ``ConcatDataset``'s parts):

- every public attribute (no leading underscore) set to another object, added or removed
  (plain values, ``int``, ``str``, ..., compare by type and value);
- inside a fastload transform pipeline (a ``Compose``, a ``MultiView``, and the fastload
  transforms in them), a setting changed in place, as
  ``ds.transform.transforms[0].size = (160, 160)``.

Not seen: a change inside any other object (a user's transform changed in place, an
element of a list replaced), and private attributes (the dataset's caches and handles,
which may differ per process by design). Nothing is pickled or called: a snapshot costs
microseconds, whatever the dataset holds. The wrapper a Loader makes of the user's dataset
(:class:`~fastload.datasets.wrap.WrappedDataset`, :class:`~fastload.datasets.subset.SubsetDataset`)
is looked through: paths read as the user's dataset's (``transform``, not
``dataset.transform``), and the ``Subset`` the Loader copied its indices from is not watched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..transforms.compose import DecodePipeline
from .subset import SubsetDataset
from .wrap import WrappedDataset

#: Values compared by type and value (immutable, cheap to compare); every other one by identity.
_PLAIN = (bool, int, float, complex, str, bytes, type(None))

#: Datasets held inside datasets are looked into this deep, and the objects of a transform
#: pipeline this deep (a MultiView of Composes of transforms holding tuples is 4).
_DEPTH = 6

#: Elements of a list or tuple looked into (a ConcatDataset's parts, a pipeline's transforms).
_ITEMS = 256


class _Ref:
    """An object compared by identity inside a pipeline's settings (tuples compare by ``==``)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ref) and other.obj is self.obj

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Snapshot:
    """A dataset's public attributes as its workers started.

    Attributes:
        entries: By key (the attribute's path through the objects walked): the name shown
            for it, and what it is compared by (a plain value, the object itself, held so
            that its identity cannot be reused, or a pipeline's settings).
    """

    entries: dict[str, tuple[str, Any]]


def snapshot(dataset: Any) -> Snapshot:
    """The public attributes of ``dataset`` and of the datasets it holds, as now.

    Args:
        dataset: What the workers copy: the Loader's dataset (or its wrapper) or a stream.

    Returns:
        The snapshot, for :func:`changed`.
    """
    entries: dict[str, tuple[str, Any]] = {}
    _walk(dataset, "", "", entries, 0, set())
    return Snapshot(entries)


def changed(before: Snapshot, dataset: Any) -> list[str]:
    """What of ``dataset`` differs from ``before``.

    Args:
        before: The snapshot taken as the workers started.
        dataset: The same dataset, now.

    Returns:
        The names of the attributes set to another object, added, removed, or (a
        pipeline) changed inside, sorted; empty where none is.
    """
    now = snapshot(dataset).entries
    moved = set()
    for key in before.entries.keys() | now.keys():
        if key not in before.entries or key not in now or not _same(before.entries[key][1], now[key][1]):
            moved.add((before.entries.get(key) or now[key])[0])
    return sorted(moved)


def _same(old: Any, new: Any) -> bool:
    if old is new:
        return True
    if type(old) is not type(new) or not isinstance(old, (*_PLAIN, tuple)):
        return False  # an object is compared by identity; a pipeline's settings are tuples
    try:
        return bool(old == new)
    except Exception:  # noqa: BLE001 - a value's own __eq__ may raise anything: count it as changed
        return False


def _walk(obj: Any, key: str, shown: str, entries: dict, depth: int, seen: set[int]) -> None:
    if id(obj) in seen or depth > _DEPTH:
        return
    seen.add(id(obj))
    if isinstance(obj, (WrappedDataset, SubsetDataset)):
        # The Loader's wrapper: its user's dataset is shown as the user's; the Subset it was
        # made from ("given") is not what the workers load (the Loader copied its indices).
        _walk(obj.dataset, key + "dataset.", shown, entries, depth + 1, seen)
    skip = ("dataset", "given") if isinstance(obj, (WrappedDataset, SubsetDataset)) else ()
    try:
        attrs = vars(obj)
    except TypeError:  # no __dict__ (slots, a C type): nothing public to compare
        return
    for name, value in list(attrs.items()):
        if not isinstance(name, str) or name.startswith("_") or name in skip:
            continue
        path, label = key + name, shown + name
        entries[path] = (label, _settings(value, 0) if isinstance(value, DecodePipeline) else value)
        for k, held in _datasets(value):
            _walk(held, f"{path}{k}.", f"{label}{k}.", entries, depth + 1, seen)


def _datasets(value: Any) -> list[tuple[str, Any]]:
    """The datasets ``value`` holds: itself, or the elements of a list or tuple of them."""
    if isinstance(value, torch.utils.data.Dataset):
        return [("", value)]
    if isinstance(value, (list, tuple)) and 0 < len(value) <= _ITEMS:
        return [(f"[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.utils.data.Dataset)]
    return []


def _settings(value: Any, depth: int) -> Any:
    """What fastload's own transform objects in ``value`` are set to: their type and public
    attributes, recursively (lists and tuples elementwise); any other object itself (its
    identity)."""
    if isinstance(value, _PLAIN) or depth > _DEPTH:
        return value
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_settings(v, depth + 1) for v in value[:_ITEMS]), len(value))
    if not type(value).__module__.startswith("fastload."):
        return _Ref(value)
    try:
        attrs = vars(value)
    except TypeError:
        return _Ref(value)
    public = [(name, v) for name, v in attrs.items() if isinstance(name, str) and not name.startswith("_")]
    return (type(value), tuple((name, _settings(v, depth + 1)) for name, v in public))
