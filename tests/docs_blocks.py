"""The code blocks of the docs pages, for tests/test_docs.py.

A fenced ```python block is executed by the tests unless the line before its fence is an
HTML comment ``<!-- notest: why -->`` (invisible on the site). A ```diff block preceded by
``<!-- diff-of: PATH -->`` is checked against PATH: each of its ``+`` and context lines
must be a line of that file (after stripping), so the diff shows the file as it is.
"""

from __future__ import annotations

import dataclasses
import os
import re

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)[^\n]*$")
MARKER = re.compile(r"^<!--\s*(notest|diff-of)\s*:\s*(.+?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to docs/
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "notest" or "diff-of"
    marker_arg: str | None


def pages() -> list[str]:
    out = []
    for base, _, files in os.walk(DOCS):
        out += [os.path.relpath(os.path.join(base, f), DOCS) for f in files if f.endswith(".md")]
    return sorted(out)


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` (relative to docs/, or "../README.md")."""
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{start + 1}: unclosed code fence")
        prev = lines[start - 1] if start else ""
        mark = MARKER.match(prev.strip())
        found.append(
            Block(
                page,
                start + 1,
                lang,
                "\n".join(lines[start + 1 : j]) + "\n",
                mark.group(1) if mark else None,
                mark.group(2) if mark else None,
            )
        )
        i = j + 1
    return found


def script(page: str) -> str | None:
    """The page's runnable python blocks as one script (one namespace, in page order), each
    block preceded by a comment naming its line; None when the page has none."""
    parts = [
        f"# --- {b.page}:{b.line}\n{b.code}"
        for b in blocks(page)
        if b.lang in ("python", "py") and b.marker != "notest"
    ]
    return "\n".join(parts) if parts else None
