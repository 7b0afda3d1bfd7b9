"""The old spellings of grouped options: still taken, with a DeprecationWarning naming the new form.

fastload's own options were grouped where they belong (issue 33): ``mean``, ``std`` and
``dtype`` are fields of ``normalize=fl.Normalize(...)``; ``rank``, ``world_size``,
``drop_uneven`` and ``shuffle_seed`` of ``shard=fl.Shard(...)``; ``start_method`` is
DataLoader's ``multiprocessing_context``. Scripts, saved tuner reports and configs
written with the old names keep working: as keywords of ``fl.Loader`` and
``fl.LoaderConfig`` (and ``LoaderConfig.replace``), and as attributes read from a config.
"""

from __future__ import annotations

import dataclasses
import multiprocessing.context
import warnings
from typing import Any

from .groups import Normalize, Shard

#: An old keyword → the group whose field of the same name it now is.
MOVED = {
    "mean": "normalize",
    "std": "normalize",
    "dtype": "normalize",
    "rank": "shard",
    "world_size": "shard",
    "drop_uneven": "shard",
    "shuffle_seed": "shard",
}
#: An old keyword → its new name (same values).
RENAMED = {"start_method": "multiprocessing_context"}
OLD = (*MOVED, *RENAMED)
GROUPS: dict[str, type[Normalize] | type[Shard]] = {"normalize": Normalize, "shard": Shard}


def _method(context: Any) -> Any:
    """A multiprocessing context stands for its start method's name (``multiprocessing_context``
    takes either: ``get_context("spawn")`` and ``start_method="spawn"`` agree)."""
    return context.get_start_method() if isinstance(context, multiprocessing.context.BaseContext) else context


def _call(group: str, fields: dict) -> str:
    return f"{group}=fl.{GROUPS[group].__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


def upgrade(options: dict, current: dict[str, Any], where: str, stacklevel: int) -> dict:
    """``options`` with each old spelling in its new form, one DeprecationWarning per group.

    Args:
        options: Keywords as given.
        current: The value of each group ("normalize", "shard") that moved fields go into
            where ``options`` does not give the group itself.
        where: The call, for the warning (``fl.Loader``, ``fl.LoaderConfig``).
        stacklevel: Of the warning: the caller's frame.

    Raises:
        ValueError: An old and a new spelling with different values, or a bad value.
    """
    old = [k for k in options if k in OLD]
    if not old:
        return options
    options = dict(options)
    for name, new in RENAMED.items():
        if name not in options:
            continue
        value = options.pop(name)
        given = options.get(new)
        if given is not None and _method(given) != value:
            raise ValueError(f"{new}={_method(given)!r} and {name}={value!r} disagree: give {new} alone")
        options[new] = value if given is None else given
        warnings.warn(
            f"{where}({name}=...) is deprecated: write {new}={value!r} (DataLoader's keyword)",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    for group, kind in GROUPS.items():
        fields = {k: options.pop(k) for k in old if MOVED.get(k) == group}
        if not fields:
            continue
        value = kind.of(options[group] if group in options else current[group])
        given = ", ".join(f"{k}=..." for k in fields)
        if value is False:  # normalize=False: a uint8 batch, which mean, std and dtype never touched
            warnings.warn(
                f"{where}({given}) is deprecated, and ignored with normalize=False (the batch stays "
                f"uint8): leave it out, or write {_call(group, fields)}",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
            continue
        options[group] = dataclasses.replace(value, **fields)
        warnings.warn(
            f"{where}({given}) is deprecated: write {_call(group, fields)}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    return options


def read_old(config: Any, name: str) -> Any:
    """The value the old attribute ``name`` of ``config`` (a LoaderConfig) stands for, with a
    DeprecationWarning naming the new one; AttributeError for any other name."""
    if name in RENAMED:
        new = RENAMED[name]
        warnings.warn(f"LoaderConfig.{name} is deprecated: read .{new}", DeprecationWarning, stacklevel=3)
        return getattr(config, new)
    if name not in MOVED:
        raise AttributeError(f"'LoaderConfig' object has no attribute {name!r}")
    group = MOVED[name]
    warnings.warn(f"LoaderConfig.{name} is deprecated: read .{group}.{name}", DeprecationWarning, stacklevel=3)
    value = getattr(config, group)
    return getattr(value if value is not False else GROUPS[group](), name)
