"""The architecture guide's counts and its matrix of what runs where, made from the code.

    python tools/arch_counts.py            # prints both blocks
    python tools/arch_counts.py --write    # writes them into docs/guides/architecture.md

The guide holds each block between markers (``<!-- counts:begin -->`` ... ``<!-- counts:end -->``,
``<!-- matrix:begin -->`` ... ``<!-- matrix:end -->``); ``tests/test_architecture.py`` checks
that they are this script's output, so a count or a cell that is no longer true fails there.

The counts are read from the source, nothing imported: with ``ast``, the functions that
write pixel rows into a batch buffer through ``put`` or ``write_row`` (a row assigned
otherwise is not seen), the call sites of both, ``isinstance`` on pool and lease classes;
by their text, the ``getattr`` / ``hasattr`` lines; by walking the tree, the modules per
layer (the layers of ``tests/test_layers.py``). The matrix is
``tests/test_matrix.py``'s data: its sources, runners, and the rule by which it refuses a
cell (``refusal``), run here on that data alone.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import sys
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "fastload")
GUIDE = os.path.join(ROOT, "docs", "guides", "architecture.md")
LAYERS_TEST = os.path.join(ROOT, "tests", "test_layers.py")
MATRIX_TEST = os.path.join(ROOT, "tests", "test_matrix.py")

ROW_WRITERS = ("put", "write_row")  # the functions that copy a sample's pixels into its row
BUILDER_HOMES = ("fastload/sources/maker.py", "fastload/sources/fetch.py")

#: The matrix's sources (tests/test_matrix.py's ids), as the guide names them.
SOURCE_NAMES = {
    "folder": "`ImageFolder`",
    "list": "`ImageList` (a list file)",
    "lmdb": "`LMDBDataset`",
    "tfrecord": "`TFRecordDataset`",
    "tfrecord-stream": "`TFRecordStream`",
    "wds": "`WebDataset`, local shards",
    "wds-http": "`WebDataset` over HTTP",
    "user": "a user's own map-style `Dataset`",
}


def modules() -> list[str]:
    """Every module of the package, as ``fastload/...py``, sorted."""
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/"))
    return sorted(found)


def short(module: str) -> str:
    return module.removeprefix("fastload/")


@functools.cache
def read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def unit(module: str) -> str:
    """The layer unit of ``module``: its top-level folder or module under ``fastload/``."""
    first = module.split("/")[1]
    return first[:-3] if first.endswith(".py") else first


def literal(path: str, name: str) -> object:
    """The value of the module-level assignment ``name = <literal>`` in ``path``."""
    for node in ast.parse(read(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} is not assigned in {path}")


def called(node: ast.Call) -> str | None:
    """The plain name a call calls (``f(...)``, not ``x.f(...)``)."""
    return node.func.id if isinstance(node.func, ast.Name) else None


@functools.cache
def tree(module: str) -> ast.Module:
    return ast.parse(read(module))


@functools.cache
def calls(module: str) -> list[tuple[ast.Call, str]]:
    """Every call in ``module``, with the function it lies in (``Class.method()``, ``function()``:
    the outermost one, so a nested helper counts as its function's; "" at module level)."""
    found = []

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, ast.ClassDef) and not where:
                here = child.name
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and "()" not in where:
                here = f"{where}.{child.name}()" if where else f"{child.name}()"
            if isinstance(child, ast.Call):
                found.append((child, where))
            walk(child, here)

    walk(tree(module), "")
    return found


def sites(module: str, pick: Callable[[ast.Call], bool]) -> list[str]:
    """The function of each call in ``module`` that ``pick`` picks (one entry per call)."""
    return [where or "(module)" for node, where in calls(module) if pick(node)]


def writes_row(node: ast.Call) -> bool:
    return called(node) in ROW_WRITERS


def isinstance_on(named: Callable[[str], bool]) -> Callable[[ast.Call], bool]:
    """Picks ``isinstance(x, C)`` where a class C it names is one ``named`` picks."""

    def pick(node: ast.Call) -> bool:
        if called(node) != "isinstance" or len(node.args) != 2:
            return False
        names = [
            n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node.args[1])
            if isinstance(n, (ast.Name, ast.Attribute))
        ]
        return any(named(name) for name in names)

    return pick


def runtime_protocols(mods: list[str]) -> set[str]:
    """The classes of ``fastload/`` decorated ``@runtime_checkable``: ``isinstance`` on one of
    them asks whether an object has the protocol's attributes, by name."""
    found = set()
    for m in mods:
        for node in tree(m).body:  # protocols are classes at a module's top level
            decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", ())]
            if isinstance(node, ast.ClassDef) and any("runtime_checkable" in d for d in decorators):
                found.add(node.name)
    return found


def probe_lines(module: str) -> int:
    """Lines of ``module`` with ``getattr(`` or ``hasattr(`` (as ``grep -E "getattr\\(|hasattr\\("`` counts them)."""
    return sum(1 for line in read(module).splitlines() if "getattr(" in line or "hasattr(" in line)


def counts() -> str:
    """The counts block (Markdown)."""
    mods = modules()
    protocols = runtime_protocols(mods)
    builders = {m: list(dict.fromkeys(sites(m, writes_row))) for m in mods}
    outside = {m: sites(m, writes_row) for m in mods if m not in BUILDER_HOMES}
    puts = {m: sites(m, lambda n: called(n) == "put") for m in mods}
    pools = {m: sites(m, isinstance_on(lambda c: c.endswith("Pool"))) for m in mods}
    leases = {m: sites(m, isinstance_on(lambda c: c.endswith("Lease"))) for m in mods}
    structural = {m: sites(m, isinstance_on(protocols.__contains__)) for m in mods}
    layers = literal(LAYERS_TEST, "LAYERS")
    assert isinstance(layers, list)

    def at(found: dict[str, list[str]]) -> str:
        """``file``: each function, ×n where it calls more than once; "none"."""
        parts = []
        for m, where in found.items():
            if where:
                counted = ", ".join(
                    f"`{w}`" + (f" ×{where.count(w)}" if where.count(w) > 1 else "") for w in dict.fromkeys(where)
                )
                parts.append(f"`{short(m)}`: {counted}")
        return "; ".join(parts) or "none"

    def count(found: dict[str, list[str]]) -> int:
        return sum(map(len, found.values()))

    out = [
        "| what is counted | count | where (file: function) |",
        "|---|---|---|",
        "| functions that call `put` or `write_row` (a sample's pixels into its batch row) | "
        f"{count(builders)} | {at(builders)} |",
        f"| calls of `put` or `write_row` outside `maker.py` and `fetch.py` | {count(outside)} | {at(outside)} |",
        f"| calls of `put` (a loaded sample into its row) | {count(puts)} | {at(puts)} |",
        f"| `isinstance` on a pool class (`...Pool`) | {count(pools)} | {at(pools)} |",
        f"| `isinstance` on a lease class (`...Lease`) | {count(leases)} | {at(leases)} |",
        f"| `isinstance` on one of fastload's {len(protocols)} `@runtime_checkable` protocols "
        f"(attributes asked for by name) | {count(structural)} | {at(structural)} |",
        f"| lines with `getattr(` or `hasattr(` in `fastload/` | {sum(map(probe_lines, mods))} | by layer below |",
        "",
        # No line counts: they change with every edit, and a count that must be regenerated for
        # every change says nothing about the design (`find fastload -name '*.py' | xargs cat | wc -l`).
        "| layer (lowest first) | modules | `getattr(` / `hasattr(` lines |",
        "|---|---|---|",
    ]
    for layer in layers:
        mine = [m for m in mods if unit(m) in layer]
        names = ", ".join(f"`{u}`" for u in sorted(layer))
        out.append(f"| {names} | {len(mine)} | {sum(probe_lines(m) for m in mine)} |")
    placed = {u for layer in layers for u in layer}
    assert all(unit(m) in placed for m in mods), "a unit of fastload/ is in no layer of tests/test_layers.py"
    out.append(f"| all | {len(mods)} | {sum(probe_lines(m) for m in mods)} |")
    return "\n".join(out)


def matrix_data() -> dict:
    """tests/test_matrix.py's SOURCES, RUNNERS, REFUSED and its ``refusal`` rule,
    run from its own source with nothing else of that module."""
    tree = ast.parse(read(os.path.relpath(MATRIX_TEST, ROOT)))
    wanted = {"SOURCES", "RUNNERS", "REFUSED", "refusal"}
    nodes = [
        n
        for n in tree.body
        if (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in wanted for t in n.targets))
        or (isinstance(n, ast.FunctionDef) and n.name in wanted)
    ]
    space: dict = {}
    exec(compile(ast.Module(nodes, []), MATRIX_TEST, "exec"), space)  # literals and one pure function
    missing = wanted - set(space)
    assert not missing, f"tests/test_matrix.py no longer defines {missing}"
    return space


def matrix() -> str:
    """The matrix block (Markdown): a row per source, a column per runner and decoder."""
    data = matrix_data()
    sources, runners, refusal = data["SOURCES"], data["RUNNERS"], data["refusal"]
    assert list(SOURCE_NAMES) == list(sources), "tests/test_matrix.py's sources differ from SOURCE_NAMES"
    reasons: list[tuple] = []

    def note(refused: tuple) -> str:
        if refused not in reasons:
            reasons.append(refused)
        return f"refused ({reasons.index(refused) + 1})"

    def cell(source: str, decode: str) -> str:
        one, two = refusal(source, decode, 1), refusal(source, decode, 2)
        if one is not None:
            return note(one) if two == one else f"{note(one)}; 2 views: {note(two) if two else 'run'}"
        return "runs" if two is None else f"runs; 2 views: {note(two)}"

    def title(runner: str) -> str:
        kw = runners[runner]
        return ", ".join(f"`{k}={v!r}`" for k, v in kw.items())

    columns = [(r, d) for r in runners for d in ("cpu", "gpu")]
    out = [
        "| source | " + " | ".join(f"{title(r)}, `decode={d!r}`" for r, d in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for source in sources:
        out.append(f"| {SOURCE_NAMES[source]} | " + " | ".join(cell(source, d) for _, d in columns) + " |")
    out.append("")
    for k, (error, message, why) in enumerate(reasons, 1):
        out.append(f'{k}. `{error.__name__}`: "{message} ...": {why}.')
    return "\n".join(out)


BLOCKS = {"counts": counts, "matrix": matrix}


def embedded(text: str, name: str) -> str | None:
    """The block ``name`` as the guide holds it between its markers (None: no markers)."""
    found = re.search(rf"<!-- {name}:begin -->\n(.*?)\n?<!-- {name}:end -->", text, re.S)
    return found.group(1) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the blocks into the guide between its markers")
    args = parser.parse_args(argv)
    blocks = {name: make() for name, make in BLOCKS.items()}
    if not args.write:
        for name, block in blocks.items():
            print(f"<!-- {name}:begin -->\n{block}\n<!-- {name}:end -->\n")
        return 0
    with open(GUIDE) as f:
        text = f.read()
    for name, block in blocks.items():
        if embedded(text, name) is None:
            print(f"{GUIDE}: no <!-- {name}:begin --> ... <!-- {name}:end --> markers", file=sys.stderr)
            return 1
        begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
        head, rest = text.split(begin, 1)
        text = head + begin + block + "\n" + end + rest.split(end, 1)[1]
    with open(GUIDE, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
