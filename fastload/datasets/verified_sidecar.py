"""The ``verified`` section of a shard set's sidecar: per shard, each record's CRC32C where a
converter's strict decode accepted it (``--verify``), so readers can tell verified bytes.

The sidecar is the JSON file fastload's converters write beside TFRecord and WebDataset
shards (``<stem>.fastload.json``); with ``--verify`` it also holds::

    "verified": {"by": "fastload 0.9.0, strict, turbojpeg", "strict": true,
                 "checksum": "crc32c", "of": "<what each checksum covers>",
                 "records": {"<shard name>": [crc32c or -1, ...], ...}}

one list per shard, one entry per record in the shard's order, -1
(:data:`fastload.verified.NOT_VERIFIED`) where the strict decode refused the record (it is
decoded strictly when read). Readers before this section ignore it. Everything in it is
checked before use; a malformed section is a ValueError naming the sidecar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..verified import NOT_VERIFIED

SECTION = "verified"
#: What a TFRecord checksum covers: the record's data, which its frame holds a masked CRC32C of.
OF_RECORD_DATA = "record data"
#: What a WebDataset checksum covers: the sample's image member.
OF_IMAGE_MEMBER = "image member"


def verified_section(by: str, of: str, records: Mapping[str, Any]) -> dict:
    """The section for ``records`` (shard name → per-record CRC32Cs, NOT_VERIFIED where refused)."""
    return {
        "by": by,
        "strict": True,
        "checksum": "crc32c",
        "of": of,
        "records": {name: [int(v) for v in crcs] for name, crcs in records.items()},
    }


def parse_verified(meta: Any, path: str, of: str, counts: Mapping[str, int]) -> tuple[str, dict[str, np.ndarray]]:
    """Who verified and each shard's checksums (int64 arrays, NOT_VERIFIED where not) from the
    sidecar ``meta`` read from ``path``; ("", {}) when it has no such section.

    Args:
        meta: The sidecar's parsed JSON.
        path: The sidecar, for messages.
        of: What the checksums must cover (:data:`OF_RECORD_DATA` or :data:`OF_IMAGE_MEMBER`).
        counts: The sidecar's record count per shard name: each list must have as many entries.

    Raises:
        ValueError: The section is malformed (named, with what is wrong).
    """
    section = meta.get(SECTION) if isinstance(meta, dict) else None
    if section is None:
        return "", {}

    def bad(problem: str) -> ValueError:
        return ValueError(
            f"{path}: a malformed '{SECTION}' section ({problem}); convert again with --verify, "
            "or pass verified=False to decode every record strictly"
        )

    if not isinstance(section, dict) or not isinstance(section.get("by"), str):
        raise bad("it needs 'by', a string")
    if section.get("strict") is not True or section.get("checksum") != "crc32c" or section.get("of") != of:
        raise bad(
            f"strict {section.get('strict')!r}, checksum {section.get('checksum')!r}, of {section.get('of')!r}; "
            f"this reader takes strict true, crc32c, of {of!r}"
        )
    records = section.get("records")
    if not isinstance(records, dict):
        raise bad("'records' is not an object of shard name → checksums")
    out: dict[str, np.ndarray] = {}
    for name, crcs in records.items():
        if name not in counts:
            raise bad(f"shard {name!r} has no record count in the sidecar")
        # Checked before numpy sees them: a bool or float would convert silently.
        if not isinstance(crcs, list) or not all(type(v) is int and NOT_VERIFIED <= v <= 0xFFFFFFFF for v in crcs):
            raise bad(f"shard {name!r}: checksums must be a list of ints in -1..0xFFFFFFFF")
        if len(crcs) != counts[name]:
            raise bad(f"shard {name!r}: {len(crcs)} checksums for {counts[name]} records")
        out[name] = np.asarray(crcs, np.int64)
    return section["by"], out
