"""Mutations of the device driver's synchronization, for the tests that prove the
simulator catches each one: a method's source with some statements replaced, compiled in
its module and patched in for one test."""

from __future__ import annotations

import __future__
import inspect
import sys
import textwrap
from typing import Any


def mutate(monkeypatch: Any, owner: type, name: str, edits: list[tuple]) -> None:
    """Patches ``owner.name`` with its source edited: each ``(old, new[, nth])`` replaces the
    ``nth`` line (default: the only one) whose code (comment aside) is ``old``, keeping its
    indentation."""
    lines = textwrap.dedent(inspect.getsource(getattr(owner, name))).splitlines()
    for old, new, *nth in edits:
        at = [i for i, line in enumerate(lines) if line.split("  #")[0].strip() == old]
        if not at or (not nth and len(at) != 1):
            raise AssertionError(f"{owner.__name__}.{name} has {len(at)} lines {old!r}: update the mutation")
        i = at[nth[0] if nth else 0]
        lines[i] = lines[i][: len(lines[i]) - len(lines[i].lstrip())] + new
    code = compile("\n".join(lines), f"<{owner.__name__}.{name}, mutated>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {}
    exec(code, sys.modules[owner.__module__].__dict__, namespace)
    monkeypatch.setattr(owner, name, namespace[name])
