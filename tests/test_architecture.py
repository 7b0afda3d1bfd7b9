"""The architecture guide is a true map of the package (issue 33, item 10): its module table
is one table, names every module, and names no module that is gone; its counts and its matrix
of what runs where are tools/arch_counts.py's output (issue 37)."""

import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guides", "architecture.md")
HEADER = "| module | what it does |"


def table_rows() -> list[tuple[str, str]]:
    """(folder, row) of each row of the module table, up to the first line that is not a row
    (a blank line ends a Markdown table: rows after it are no longer the table's)."""
    with open(GUIDE) as f:
        lines = f.read().splitlines()
    start = lines.index(HEADER) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first = re.findall(r"`([^`]+)`", line.split("|")[1])[0]
        rows.append((first if first.endswith("/") else os.path.dirname(first) + "/", line))
    return rows


def modules() -> list[str]:
    """Every module of the package, as ``fastload/...py``; a subpackage's ``__init__.py``
    (its public names, re-exported) is named by its folder's row."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "fastload")):
        rel = os.path.relpath(folder, ROOT)
        for name in files:
            if name.endswith(".py") and not (name == "__init__.py" and rel != "fastload"):
                found.append(f"{rel}/{name}")
    return sorted(found)


def named(module: str, rows: list[tuple[str, str]]) -> bool:
    """Whether a row names ``module``: by its path, or by its file name in a row of a folder
    it lies in."""
    base = f"`{os.path.basename(module)}`"
    return any(f"`{module}`" in row or (module.startswith(folder) and base in row) for folder, row in rows)


def test_every_module_is_named_in_the_one_table():
    rows = table_rows()
    missing = [m for m in modules() if not named(m, rows)]
    assert not missing, f"{len(missing)} modules the architecture guide's table does not name: {missing}"


def test_every_file_the_table_names_exists():
    gone = []
    for folder, row in table_rows():
        for name in re.findall(r"`([\w/]+\.py)`", row):
            here = os.path.join(ROOT, name) if name.startswith("fastload/") else None
            if here is not None and os.path.exists(here):
                continue
            under = os.path.join(ROOT, folder)
            if not any(name.split("/")[-1] in files for _, _, files in os.walk(under)):
                gone.append(f"{name} (row of {folder})")
    assert not gone, f"the architecture guide names modules that do not exist: {gone}"


def test_the_guides_counts_and_matrix_are_the_scripts_output():
    """A count or a cell typed into the guide, or left stale by a change of the code or of
    tests/test_matrix.py, fails here; ``python tools/arch_counts.py --write`` writes them."""
    spec = importlib.util.spec_from_file_location("arch_counts", os.path.join(ROOT, "tools", "arch_counts.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with open(GUIDE) as f:
        text = f.read()
    for name, make in script.BLOCKS.items():
        assert script.embedded(text, name) == make(), (
            f"the architecture guide's {name} block is not tools/arch_counts.py's output: "
            "run python tools/arch_counts.py --write"
        )
