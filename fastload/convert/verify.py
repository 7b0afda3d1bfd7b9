"""Reading a conversion's output back: count, labels, checksums, and a full decode of every image."""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm import tqdm

from ..datasets.open import open_dataset
from ..decode import decode_image

SHOWN = 10
CHUNK = 512


class VerifyError(ValueError):
    """The output of a conversion does not read back as its source.

    Attributes:
        failures: One message per failed record ("record <i> (<where>): <problems>").
        total: How many records were checked.
    """

    def __init__(self, dst: str, failures: list[str], total: int) -> None:
        shown = "; ".join(failures[:SHOWN]) + (f"; and {len(failures) - SHOWN} more" if len(failures) > SHOWN else "")
        super().__init__(f"verify: {len(failures)} of {total} records of {dst} failed: {shown}")
        self.failures, self.total = failures, total


def verify(
    dst: str,
    crcs: np.ndarray,
    labels: np.ndarray,
    progress: bool = True,
    workers: int = 4,
    decoded: np.ndarray | None = None,
) -> None:
    """Reads ``dst`` back through fastload: count, each label and crc32, and decodes every image
    (but those ``decoded`` marks: decoded strictly before they were written, with the bytes
    the crc32 says they still are).

    Raises:
        VerifyError: Lists every record that failed and why (after checking them all).
    """
    ds = open_dataset(dst)
    if len(ds) != len(crcs):
        raise VerifyError(dst, [f"has {len(ds)} records, expected {len(crcs)}"], len(crcs))

    def check(i: int) -> str | None:
        try:
            data, label = ds.read(i)
        except Exception as e:
            return f"record {i} ({ds.describe(i)}): unreadable: {type(e).__name__}: {e}"
        problems = []
        if label != labels[i]:
            problems.append(f"label {label}, expected {labels[i]}")
        if zlib.crc32(bytes(data)) != crcs[i]:
            problems.append("differs from the source (checksum)")
        if decoded is None or not decoded[i]:
            try:
                decode_image(data)
            except Exception as e:
                problems.append(f"does not decode: {type(e).__name__}: {e}")
        return f"record {i} ({ds.describe(i)}): {'; '.join(problems)}" if problems else None

    failures = []
    n = len(ds)
    with (
        ThreadPoolExecutor(max(1, workers)) as pool,
        tqdm(total=n, desc=f"verify {dst}", unit="images", disable=not progress) as bar,
    ):
        for start in range(0, n, CHUNK):  # bounded: a million futures at once would not be
            for failure in pool.map(check, range(start, min(n, start + CHUNK))):
                if failure is not None:
                    failures.append(failure)
                bar.update(1)
    if failures:
        raise VerifyError(dst, failures, len(ds))
