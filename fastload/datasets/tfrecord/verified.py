"""Records a converter verified strictly (``--verify``): their data checked against the CRC32C
the shard set's sidecar recorded (:mod:`fastload.datasets.verified_sidecar`).

A TFRecord frame already ends in a masked CRC32C of its data, and the sidecar records the
CRC32C of the same data when the strict decode accepted its image: so one CRC32C of a
record's data, the one ``check_crc`` computes anyway, says both that the frame is whole and
that the record is the one verified.
"""

from __future__ import annotations

from typing import Any

from ...verified import NOT_VERIFIED, check_bytes
from .framing import TFRecordError, mask, stored_crc


def check_verified(data: Any, framed: Any, expected: int, index: int, where: str, path: str, offset: int) -> bool:
    """Whether record ``index`` (``data``, read from ``framed``: its frame, ending in the stored
    CRC) is verified: False when ``expected`` is NOT_VERIFIED (its CRC is then checked as
    ``check_crc`` says), True when ``data``'s CRC32C is ``expected`` and the frame's CRC agrees.

    Raises:
        ChangedSinceVerifiedError: The data's CRC32C is not the verified one ("the record
            changed since it was verified: ``where``").
        TFRecordError: The data is as verified but the frame's CRC is not its CRC (damaged).
    """
    if expected == NOT_VERIFIED:
        return False
    check_bytes(data, expected, index, where, "record")
    if stored_crc(framed) != mask(expected):
        raise TFRecordError(path, offset, f"data CRC mismatch in record at byte {offset}")
    return True
