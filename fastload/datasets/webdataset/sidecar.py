"""The sidecar fastload's converter writes beside a shard set: class names and per-shard sample counts.

``<stem>.fastload.json`` beside ``<stem>-000000.tar`` ...: plain JSON,
``{"format": "fastload-webdataset", "version": 1, "classes": [...], "samples": {shard name: count}}``.
It is optional: shards from anywhere else open without one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence

from .remote import Remote, is_url, local_path

SUFFIX = ".fastload.json"
FORMAT = "fastload-webdataset"
MAX_BYTES = 64 << 20
_SHARD = re.compile(r"^(?P<stem>.+)-\d+\.tar$")


def sidecar_url(shard_url: str) -> str | None:
    """Where the sidecar of ``shard_url``'s set would be, or None for a name like no set's."""
    m = _SHARD.match(shard_url)
    return m["stem"] + SUFFIX if m else None


def write_sidecar(folder: str, stem: str, classes: Sequence[str] | None, samples: dict[str, int]) -> None:
    meta = {"format": FORMAT, "version": 1, "classes": list(classes or []), "samples": samples}
    with open(os.path.join(folder, stem + SUFFIX), "w", encoding="utf-8") as f:
        json.dump(meta, f)


def _fetch(url: str, remote: Remote) -> bytes | None:
    if not is_url(url):
        path = local_path(url)
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as f:
            return f.read()
    return remote.small(url, MAX_BYTES)


def read_classes(shard_urls: Sequence[str], remote: Remote) -> list[str] | None:
    """The class names of the shard sets' sidecars (None when none has any).

    Raises:
        ValueError: A sidecar is malformed, or two name different classes.
    """
    classes = None
    for url in dict.fromkeys(filter(None, map(sidecar_url, shard_urls))):
        raw = _fetch(url, remote)
        if raw is None:
            continue
        try:
            meta = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{url}: not a fastload sidecar: {e}") from e
        names = meta.get("classes") if isinstance(meta, dict) and meta.get("format") == FORMAT else None
        if not (isinstance(names, list) and all(isinstance(c, str) for c in names)):
            raise ValueError(f"{url}: a fastload sidecar needs format {FORMAT!r} and 'classes' (a list of strings)")
        if names:
            if classes is not None and classes != names:
                raise ValueError(f"{url}: class names differ from another shard set's")
            classes = names
    return classes
