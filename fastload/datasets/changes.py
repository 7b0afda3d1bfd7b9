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
- a fastload transform pipeline (a ``Compose``, a ``MultiView``, and the fastload transforms
  in them) by its settings: a new pipeline set alike is no change, and a setting changed in
  place is one, as ``ds.transform.transforms[0].size = 160`` (a fastload transform makes
  again what it derives from a setting set in place: :mod:`fastload.transforms.settings`);
- the ``epoch`` and ``seed`` of a fastload dataset that the workers read by index (one held
  in a ``ConcatDataset`` or in the user's own dataset): its ``set_epoch`` changes what its
  ``__getitem__`` loads. One the Loader loads itself gets the Loader's epoch and seed, and
  its ``set_epoch`` is no change.

Not seen: a change inside any other object (a user's transform changed in place, an
element of the user's own list replaced), and private attributes (the dataset's caches and handles,
which may differ per process by design). Nothing is pickled, and no object's ``__eq__`` is
called: a snapshot takes well under a millisecond, whatever the dataset holds. The
wrapper a Loader makes of the user's dataset (:class:`~fastload.datasets.wrap.WrappedDataset`,
:class:`~fastload.datasets.subset.SubsetDataset`) is looked through: the user's dataset's
attributes read as theirs (``transform``, not ``dataset.transform``), the wrapper's own as
``loader.transform``, and the ``Subset`` of a fastload dataset whose indices the Loader
copied is not watched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..transforms.compose import DecodePipeline
from .base import ImageDataset
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
    """An object inside a pipeline's settings, compared by identity (:func:`_same`)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj


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
    _walk(dataset, "", "", entries, 0, set(), False)  # the root is loaded by the Loader's load (or a stream's)
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


def same_settings(a: Any, b: Any) -> bool:
    """Whether fastload objects ``a`` and ``b`` are set alike (as :func:`changed` compares a
    pipeline: their public attributes, recursively; any other object by identity), e.g. two
    GPU decode pipelines made of one transform each, the transforms set alike."""
    return _same(_settings(a, 0), _settings(b, 0))


def _same(old: Any, new: Any) -> bool:
    """Plain values by type and value; tuples (a pipeline's settings) elementwise; any other
    object by identity: no object's own ``__eq__`` is called."""
    if old is new:
        return True
    if type(old) is not type(new):
        return False
    if isinstance(old, _Ref):
        return old.obj is new.obj
    if isinstance(old, tuple):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new))
    if isinstance(old, _PLAIN):
        try:
            return bool(old == new)
        except Exception:  # noqa: BLE001 - a subclass's own __eq__ may raise anything: changed
            return False
    return False


def _walk(obj: Any, key: str, shown: str, entries: dict, depth: int, seen: set[int], by_index: bool) -> None:
    """Records ``obj``'s public attributes and walks the datasets it holds; ``by_index``: the
    workers read ``obj`` by ``obj[i]`` (held by a user's dataset), not by the Loader's own
    ``load`` (with the Loader's epoch and seed)."""
    if id(obj) in seen or depth > _DEPTH:
        return
    seen.add(id(obj))
    wrapper = isinstance(obj, (WrappedDataset, SubsetDataset))
    if wrapper:
        # The Loader's wrapper: its user's dataset is shown as the user's (read by obj[i] in a
        # WrappedDataset, by load in a SubsetDataset); the Subset it was made from ("given") is
        # not what the workers load (the Loader copied its indices).
        inner_by_index = isinstance(obj, WrappedDataset)
        _walk(obj.dataset, key + "dataset.", shown, entries, depth + 1, seen, inner_by_index)
    if by_index and isinstance(obj, ImageDataset):
        # Its __getitem__ loads with its own epoch and seed (set_epoch): private, so named here.
        entries[key + "epoch"] = (shown + "epoch", obj.epoch)
        entries[key + "seed"] = (shown + "seed", obj.seed)
    try:
        attrs = vars(obj)
    except TypeError:  # no __dict__ (slots, a C type): nothing public to compare
        return
    for name, value in list(attrs.items()):
        if not isinstance(name, str) or name.startswith("_") or (wrapper and name in ("dataset", "given")):
            continue
        path, label = key + name, ("loader." if wrapper else shown) + name
        entries[path] = (label, _settings(value, 0) if isinstance(value, DecodePipeline) else value)
        for k, held in _datasets(value):
            _walk(held, f"{path}{k}.", f"{label}{k}.", entries, depth + 1, seen, True)


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
