"""The package's layering: each folder imports only the layers beneath it, and no module
imports one that imports it back (issue 28 item 18). Read from the source, so a new climb
or circle fails here, naming the import."""

from __future__ import annotations

import ast
import os

import fastload

PACKAGE = os.path.dirname(fastload.__file__)

# Lowest first. A unit is a top-level module or folder of fastload; units of one layer may
# import each other.
LAYERS = [
    {"photos", "system"},
    {"views", "targets", "batch", "encoded", "config"},
    {"decode", "verified"},
    {"transforms"},
    {"datasets"},
    {"collate"},
    {"sources"},
    {"device", "augment"},
    {"loading"},
    {"loader"},
    {"dataloader"},
    {"tune", "convert"},
    {"cli", "__main__", "__init__"},
]
LEVEL = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def _runtime_imports(
    module: str, path: str, modules: dict[str, str], *, at_import: bool = False
) -> list[tuple[int, str]]:
    """(line, module) of every fastload module ``module`` imports at run time (imports under
    ``if TYPE_CHECKING:`` are for annotations only and are left out); with ``at_import``, only
    those that run when it is imported (not inside a function: a class body runs then)."""
    tree = ast.parse(open(path).read())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
        if at_import and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            skipped.update(id(n) for n in ast.walk(node))
    package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            target = ".".join(base)
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            if target == "fastload" and not subs and all(a.name.startswith("__") for a in node.names):
                continue  # the package's own metadata (__version__), not a layer
            found += [(node.lineno, t) for t in (subs or [target])]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastload"):
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "fastload"]
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_module_belongs_to_a_layer():
    assert sorted({_unit(m) for m in _modules()} - set(LEVEL)) == []


def test_no_layer_imports_a_layer_above_it():
    modules = _modules()
    climbs = [
        f"{path}:{line} ({_unit(m)}) imports {target} ({_unit(target)})"
        for m, path in modules.items()
        for line, target in _runtime_imports(m, path, modules)
        if LEVEL.get(_unit(target), -1) > LEVEL[_unit(m)]
    ]
    assert climbs == []


def _circles(edges: dict[str, set[str]]) -> list[str]:
    """Each import circle that a depth-first walk of ``edges`` meets, as "a -> b -> a"."""
    circles, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                circles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return circles


def _edges(*, at_import: bool) -> dict[str, set[str]]:
    """Module -> the fastload modules it imports. A package's ``__init__`` is a module like
    any other: ``from . import get_decoder`` in a function of ``decode/costs.py`` is an edge
    to ``fastload.decode``, whose ``__init__`` imports what imports ``costs`` (issue 37)."""
    modules = _modules()
    return {
        m: {t for _, t in _runtime_imports(m, p, modules, at_import=at_import) if t in modules}
        for m, p in modules.items()
    }


def test_no_module_takes_part_in_an_import_circle_at_import():
    # The imports Python runs on import: in a circle, whichever module is imported first
    # meets the other half-initialized (an ImportError or a missing name, by import order).
    assert _circles(_edges(at_import=True)) == []


def test_no_import_circles_between_modules():
    # Imports inside functions too: a circle through one is hidden until the function runs
    # (issue 37: decode/__init__ -> costs -> decode/__init__, as the default backend was chosen).
    assert _circles(_edges(at_import=False)) == []
