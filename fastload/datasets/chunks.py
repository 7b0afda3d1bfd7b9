"""Reading a length a header or an index gave, in chunks: memory follows the data actually
there, not the length claimed (a damaged header or a stale index may claim gigabytes)."""

from __future__ import annotations

from typing import Any

CHUNK = 1 << 20


def read_up_to(f: Any, n: int, chunk: int = CHUNK) -> bytes:
    """``n`` bytes of the binary file ``f``, fewer only where it ends (or a stream closes)."""
    parts = []
    while n > 0:
        part = f.read(min(n, chunk))
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)  # one part: returned as it is, not copied
