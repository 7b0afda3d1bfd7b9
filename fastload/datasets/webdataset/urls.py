"""Which shards a dataset is: brace patterns, globs, folders and lists of paths or URLs."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from ..partial import check_complete
from .remote import filesystem, is_url, local_path

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
MAX_EXPANSION = 10_000_000


def _closing(pattern: str, start: int) -> int:
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced braces in {pattern!r}")


def _split_top(body: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(body):
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    return parts + [body[start:]]


def _range(body: str, pattern: str) -> list[str] | None:
    lo, sep, hi = body.partition("..")
    if not sep or not (lo.isdigit() and hi.isdigit()):
        return None
    a, b = int(lo), int(hi)
    if abs(b - a) >= MAX_EXPANSION:
        raise ValueError(f"{pattern!r}: the range {{{body}}} has more than {MAX_EXPANSION} values")
    width = max(len(lo), len(hi)) if (lo.startswith("0") or hi.startswith("0")) else 0
    step = 1 if b >= a else -1
    return [str(v).zfill(width) for v in range(a, b + step, step)]


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion: ``a-{000..002}.tar`` (zero-padded ranges) and ``{x,y}`` (alternatives).

    Raises:
        ValueError: Unbalanced braces.
    """
    start = pattern.find("{")
    if start < 0:
        if "}" in pattern:
            raise ValueError(f"unbalanced braces in {pattern!r}")
        return [pattern]
    end = _closing(pattern, start)
    head, body, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    values = _range(body, pattern)
    if values is None:
        parts = _split_top(body)
        if len(parts) == 1:  # a literal "{...}" that is no pattern
            return [head + "{" + v for v in expand_braces(body + "}" + tail)]
        values = [v for part in parts for v in expand_braces(part)]
    return [head + v + rest for v in values for rest in expand_braces(tail)]


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def expand_urls(urls: str | os.PathLike | Sequence[str | os.PathLike], storage_options: dict) -> list[str]:
    """The shards named by ``urls``: a path or URL, a brace pattern, a glob (local or in object
    storage), a folder of ``.tar`` (or ``.tar.gz``, ``.tgz``) files, or a list of these; in the
    order given, globs sorted.

    Raises:
        FileNotFoundError: A glob or folder matches no shard.
        ValueError: No shard at all, a shard named twice, a glob over HTTP (which cannot list), or
            a shard of an unfinished conversion (its folder holds the converter's marker).
    """
    items = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
    out: list[str] = []
    for item in items:
        for path in expand_braces(os.fspath(item)):
            if is_url(path) and _is_glob(path):
                if path.split("://", 1)[0] in ("http", "https"):
                    raise ValueError(
                        f"{path}: a web server cannot be listed; name the shards with a brace pattern "
                        "(shard-{000000..000099}.tar) or a list"
                    )
                fs, inner = filesystem(path, storage_options)
                found = sorted(fs.glob(inner))
                found = [fs.unstrip_protocol(f) for f in found if f.lower().endswith(SHARD_SUFFIXES)]
            elif not is_url(path) and _is_glob(local_path(path)):
                found = sorted(f for f in glob.glob(local_path(path)) if os.path.isfile(f))
            elif not is_url(path) and os.path.isdir(local_path(path)):
                folder = local_path(path)
                found = sorted(
                    os.path.join(folder, e.name)
                    for e in os.scandir(folder)
                    if e.is_file() and not e.name.startswith(".") and e.name.lower().endswith(SHARD_SUFFIXES)
                )
            else:
                out.append(path)
                continue
            if not found:
                raise FileNotFoundError(f"no shards ({', '.join(SHARD_SUFFIXES)}) match {path!r}")
            out.extend(found)
    if not out:
        raise ValueError(f"no shards named by {urls!r}")
    seen: set[str] = set()
    for path in out:
        if path in seen:
            raise ValueError(f"the shard {path} is named twice")
        seen.add(path)
    # A killed conversion's shards, named one by one, are refused as its folder is.
    for folder in sorted({os.path.dirname(local_path(p)) or "." for p in out if not is_url(p)}):
        check_complete(folder)
    return out
