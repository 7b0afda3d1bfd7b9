"""MkDocs hooks (mkdocs.yml ``hooks:``): pages that live outside ``docs/``, published as they are.

``benchmarks/RESULTS.md`` (and ``GPU.md``) and their raw outputs under ``benchmarks/results/``
keep one copy, in the repository beside the benchmarks that wrote them: the site shows
that copy, so its figures cannot drift from the measured ones, and the links in
RESULTS.md to raw outputs work on the site too. Each results folder gets a generated page
listing its files (RESULTS.md links to folders). ``CHANGELOG.md`` becomes ``changelog.md``.
"""

from __future__ import annotations

import os
import re

from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIED = {
    "CHANGELOG.md": "changelog.md",
    "benchmarks/RESULTS.md": "benchmarks/RESULTS.md",
    "benchmarks/GPU.md": "benchmarks/GPU.md",
}


def on_files(files: Files, config) -> Files:
    for source, uri in COPIED.items():
        files.append(File.generated(config, uri, abs_src_path=os.path.join(ROOT, source)))
    results = os.path.join(ROOT, "benchmarks", "results")
    for folder in sorted(os.listdir(results)):
        path = os.path.join(results, folder)
        if not os.path.isdir(path):
            continue
        names = []
        for base, dirs, found in os.walk(path):
            dirs.sort()
            for name in sorted(found):
                rel = os.path.relpath(os.path.join(base, name), path).replace(os.sep, "/")
                names.append(rel)
                files.append(
                    File.generated(config, f"benchmarks/results/{folder}/{rel}", abs_src_path=os.path.join(base, name))
                )
        listing = "\n".join(f"- [`{n}`]({n})" for n in names)
        page = f"# Raw outputs: `{folder}`\n\nAs the benchmarks printed them:\n\n{listing}\n"
        files.append(File.generated(config, f"benchmarks/results/{folder}/index.md", content=page))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """RESULTS.md links its raw-output folders as ``results/<folder>/``: on the site they are
    the generated listing pages, named so that the strict build checks them."""
    if page.file.src_uri.startswith("benchmarks/"):
        markdown = re.sub(r"\]\((results/[^)\s]+)/\)", r"](\1/index.md)", markdown)
    return markdown
