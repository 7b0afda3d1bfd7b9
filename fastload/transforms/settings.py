"""A transform's settings changed in place count as if given to its constructor.

Each fastload transform keeps every constructor argument as the public attribute of the same
name, checked and normalized (``ColorJitter(brightness=0.4).brightness == (0.6, 1.4)``), and
derives what it runs from them when made (ColorJitter's operations, a single op's function,
RandomApply's pipeline). :class:`Settings` makes one set later, in place
(``jitter.brightness = 0.2`` between epochs), count as if given to the constructor: it is
checked (a bad value raises the constructor's error and changes nothing), normalized, and
what the transform derives from it is derived again, here and in the worker processes that
copy the transform afterwards (a Loader replaces its persistent workers when the dataset's
pipeline changed, see :mod:`fastload.datasets.changes`).

Each setting is checked with the others as they are: set them in an order where each step
is valid (RandAugment's ``magnitude`` below a smaller ``num_magnitude_bins`` first), or assign
a new transform. A transform held inside another is set through its holder (a MultiView's
``counts`` name its pipelines: assign a new MultiView to change how many it has).

A Compose's or RandomApply's list changed in place (``pipeline.transforms[0] = t``,
``append``) is read again as it runs (:func:`same_items`).

Only fastload's own classes are made again: a subclass of yours may store its arguments
otherwise (a changed value under an argument's name, an argument of its own not kept), so
its attributes are set as they are, as before.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Sequence
from typing import Any

_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


_PARAMS: dict[type, tuple[str, ...] | None] = {}
_SETTING = threading.RLock()  # one setting made at a time: two threads setting two settings keep both


def _params(cls: type) -> tuple[str, ...] | None:
    """The constructor's arguments of ``cls``, by name; None where one cannot be passed by name."""
    if cls not in _PARAMS:
        params = inspect.signature(cls).parameters.values()
        ours = cls.__module__.startswith("fastload.")
        _PARAMS[cls] = tuple(p.name for p in params) if ours and all(p.kind in _KINDS for p in params) else None
    return _PARAMS[cls]


class Settings:
    """Base of fastload's transforms: a public attribute named as a constructor argument, set
    after construction, makes the transform again from its settings with the new value (the
    constructor checks it; on an error nothing changes). A list setting left as it was stays
    the list the caller may hold.

    Any other attribute is set as is, as is every attribute of a class that is not
    fastload's own (a user's subclass, see the module's docstring).
    """

    _made = False  # set once the outermost constructor returned

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def made(self: Any, *args: Any, **kw: Any) -> None:
            depth = self.__dict__.get("_depth", 0)  # a subclass's constructor calls its base's
            object.__setattr__(self, "_depth", depth + 1)
            try:
                init(self, *args, **kw)
            finally:
                object.__setattr__(self, "_depth", depth)
            if depth == 0:
                del self.__dict__["_depth"]
                object.__setattr__(self, "_made", True)

        cls.__init__ = made  # type: ignore[method-assign]

    def __setattr__(self, name: str, value: Any) -> None:
        params = _params(type(self)) if self._made and not name.startswith("_") else None
        if params is None or name not in params or any(p not in self.__dict__ for p in params):
            object.__setattr__(self, name, value)
            return
        with _SETTING:
            settings = {p: self.__dict__[p] for p in params}
            settings[name] = value
            fresh = object.__new__(type(self))
            type(self).__init__(fresh, **settings)  # checks the new value: raises before anything changes
            made = fresh.__dict__
            for p in params:  # a list the caller holds stays the transform's where its items are
                old, new = self.__dict__[p], made.get(p)
                if p != name and isinstance(old, list) and isinstance(new, list) and same_items(old, new):
                    made[p] = old
            self.__dict__.update(made)


def same_items(seen: Sequence[Any], items: Sequence[Any]) -> bool:
    """Whether ``items`` holds the objects ``seen`` held, in order (by identity: ``seen`` keeps
    them, so none is freed and its address reused by a new one)."""
    return len(seen) == len(items) and all(a is b for a, b in zip(seen, items))
