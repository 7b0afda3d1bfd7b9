"""The sidecar fastload's converter writes beside a shard set: class names and per-shard sample counts.

``<stem>.fastload.json`` beside ``<stem>-000000.tar`` ...: plain JSON,
``{"format": "fastload-webdataset", "version": 1, "classes": [...], "samples": {shard name: count}}``,
and after a conversion with ``--verify`` a ``verified`` section: per shard, the CRC32C of each
sample's image member in the shard's order (:mod:`fastload.datasets.verified_sidecar`).
It is optional: shards from anywhere else open without one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..verified_sidecar import OF_IMAGE_MEMBER, SECTION, parse_verified
from .remote import Remote, is_url, local_path

SUFFIX = ".fastload.json"
FORMAT = "fastload-webdataset"
MAX_BYTES = 64 << 20
_SHARD = re.compile(r"^(?P<stem>.+)-\d+\.tar$")


def sidecar_url(shard_url: str) -> str | None:
    """Where the sidecar of ``shard_url``'s set would be, or None for a name like no set's."""
    m = _SHARD.match(shard_url)
    return m["stem"] + SUFFIX if m else None


def write_sidecar(
    folder: str, stem: str, classes: Sequence[str] | None, samples: dict[str, int], verified: dict | None = None
) -> None:
    """Writes the sidecar of shard set ``stem`` into ``folder``; with ``verified``, the
    checksums of a strict verification (:func:`~fastload.datasets.verified_sidecar.verified_section`)."""
    meta = {"format": FORMAT, "version": 1, "classes": list(classes or []), "samples": samples}
    if verified is not None:
        meta[SECTION] = verified
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


@dataclass
class Sidecars:
    """What the sidecars of a shard list say.

    Attributes:
        classes: Class names (None when no sidecar has any).
        verified_by: Who verified the samples ("fastload VERSION, strict, DECODER"), or "".
        verified: {shard URL: per-sample CRC32C of its image member, NOT_VERIFIED where not}.
    """

    classes: list[str] | None = None
    verified_by: str = ""
    verified: dict[str, np.ndarray] = field(default_factory=dict)


def read_classes(shard_urls: Sequence[str], remote: Remote) -> list[str] | None:
    """The class names of the shard sets' sidecars (None when none has any).

    Raises:
        ValueError: A sidecar is malformed, or two name different classes.
    """
    return read_sidecars(shard_urls, remote).classes


def read_sidecars(shard_urls: Sequence[str], remote: Remote) -> Sidecars:
    """The class names and verified checksums of the shard sets' sidecars.

    Raises:
        ValueError: A sidecar is malformed, or two name different classes.
    """
    out = Sidecars()
    sets: dict[str, list[str]] = {}
    for shard in shard_urls:
        url = sidecar_url(shard)
        if url is not None:
            sets.setdefault(url, []).append(shard)
    for url, shards in sets.items():
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
            if out.classes is not None and out.classes != names:
                raise ValueError(f"{url}: class names differ from another shard set's")
            out.classes = names
        samples = meta.get("samples")
        if SECTION in meta and not (
            isinstance(samples, dict) and all(type(v) is int and v >= 0 for v in samples.values())
        ):
            raise ValueError(f"{url}: a fastload sidecar with checksums needs 'samples' (shard name → count)")
        by, verified = parse_verified(meta, url, OF_IMAGE_MEMBER, samples if isinstance(samples, dict) else {})
        for shard in shards:
            crcs = verified.get(shard.rsplit("/", 1)[-1])
            if crcs is not None:
                out.verified[shard] = crcs
                out.verified_by = out.verified_by or by
    return out
