"""Strictness established once, by checksum: ``fastload verify`` manifests and their checks.

A JPEG that the full strict decode accepted is accepted again as long as its bytes are the
same, and checking that costs a CRC32C (several GB/s), not a decode. So:

* :func:`fastload.convert.manifest.verify_folder` (``fastload verify DIR``) decodes every image under a folder
  strictly and writes a manifest into it, :data:`MANIFEST_NAME`: each file's relative path,
  size, ``mtime_ns``, CRC32C, the decoder that verified it and whether that decode was strict
  (JPEGs: libjpeg-turbo, strict; other formats: Pillow or OpenCV, not strict), with the
  fastload version. Files that fail the decode are left out (and listed); only the entries
  marked strict count as verified.
* :class:`~fastload.ImageFolder` and :class:`~fastload.ImageList` read the manifest of their
  root (:func:`load_manifest`, :func:`expected_checksums`); at read time each verified
  file's bytes are checksummed (:func:`check_bytes`): a match lets the decode take the
  cheapest plan its crop allows (a region decode, see :mod:`fastload.decode.plan`), a
  mismatch is a :class:`ChangedSinceVerifiedError` naming the file, under the loader's
  ``on_error`` policy; a file the manifest does not list is decoded strictly, as before.

The manifest is JSON (no pickle); everything in it is checked before use (its types, and
that its entries are one per path). It says what was verified, not who verified it: anyone
who can rewrite the files can rewrite it too.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .batch import SampleError
from .decode import JPEG_BACKENDS, DecodeError

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "NOT_VERIFIED",
    "ChangedSinceVerifiedError",
    "check_bytes",
    "crc32c",
    "expected_checksums",
    "load_manifest",
    "manifest_path",
    "write_manifest",
]

#: The manifest's file name, in the folder it describes.
MANIFEST_NAME = "fastload-verified.json"
#: The manifest's ``format`` field and the version this fastload writes (it reads 1 too).
FORMAT, VERSION = "fastload-verified", 2
#: In the per-sample array of expected checksums: the sample was not verified.
NOT_VERIFIED = -1
COLUMNS = ["path", "size", "mtime_ns", "crc32c", "decoder", "strict"]
#: Version 1's columns: no per-entry flag (an entry is strict where its decoder is a strict JPEG one).
COLUMNS_V1 = COLUMNS[:5]

_crc_fn: Callable[[Any], int] | None = None


def crc32c(data: Any) -> int:
    """The CRC32C (Castagnoli) of ``data`` (bytes or a buffer), from the ``crc32c`` package."""
    global _crc_fn
    if _crc_fn is None:
        try:
            import crc32c as module
        except ImportError as e:  # a dependency of fastload (and of tfrecord)
            raise ImportError("checksums of verified data need the crc32c package: pip install crc32c") from e
        _crc_fn = module.crc32c
    return _crc_fn(data)


class ChangedSinceVerifiedError(DecodeError, SampleError):
    """A verified sample's bytes no longer have the checksum they had when verified: it is
    refused (never decoded), as a damaged file is. ``index`` and ``where`` name it."""

    def __init__(self, message: str, index: int | None = None, where: str | None = None) -> None:
        SampleError.__init__(self, message, index, where)


def check_bytes(data: Any, expected: int, index: int, where: str, what: str = "file") -> bool:
    """Whether sample ``index`` (``where``: its path or key) is verified: False when ``expected``
    is :data:`NOT_VERIFIED`, True when ``data``'s CRC32C is ``expected``.

    Raises:
        ChangedSinceVerifiedError: The checksum differs ("the file changed since it was
            verified: PATH"; ``what`` says "record" for records of a converted dataset).
    """
    if expected == NOT_VERIFIED:
        return False
    got = crc32c(data)
    if got != expected:
        raise ChangedSinceVerifiedError(
            f"the {what} changed since it was verified: {where} (sample {index}: CRC32C {got:08x}, "
            f"verified {expected:08x}; refused, not decoded; verify it again if the change is intended)",
            index,
            where,
        )
    return True


def manifest_path(root: str | os.PathLike) -> str:
    """Where the manifest of folder ``root`` lives: ``root/fastload-verified.json``."""
    return os.path.join(os.fspath(root), MANIFEST_NAME)


def _bad(path: str, problem: str) -> ValueError:
    return ValueError(
        f"{path}: not a usable fastload verify manifest ({problem}); run `fastload verify` again, "
        "or pass verified=False to decode every file strictly"
    )


def load_manifest(path: str) -> dict[str, int]:
    """The CRC32C of every file the manifest at ``path`` lists as verified strictly, by relative path
    (entries whose decode was not strict, other formats than JPEG, are not among them).

    Raises:
        ValueError: The file is not such a manifest, or is malformed (named, with what is wrong).
        OSError: It cannot be read.
    """
    with open(path, "rb") as f:
        try:
            doc = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _bad(path, f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _bad(path, f"its format is not {FORMAT!r}")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _bad(path, f"version {version!r}")
    if version > VERSION:
        raise ValueError(f"{path}: manifest version {version} is newer than this fastload reads ({VERSION}); upgrade")
    if doc.get("strict") is not True:
        raise _bad(path, f"'strict' is {doc.get('strict')!r}, not true")
    columns = COLUMNS if version >= 2 else COLUMNS_V1
    if doc.get("checksum") != "crc32c" or doc.get("columns") != columns:
        raise _bad(path, f"checksum {doc.get('checksum')!r}, columns {doc.get('columns')!r}")
    files = doc.get("files")
    if not isinstance(files, list):
        raise _bad(path, "'files' is not a list")
    out: dict[str, int] = {}
    seen: set[str] = set()
    for n, row in enumerate(files):
        if (
            not isinstance(row, list)
            or len(row) != len(columns)
            or not isinstance(row[0], str)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in row[1:4])
            or not 0 <= row[3] <= 0xFFFFFFFF
            or not isinstance(row[4], str)
            or (len(row) > 5 and not isinstance(row[5], bool))
        ):
            raise _bad(path, f"entry {n} is {str(row)[:200]}")
        if row[0] in seen:
            raise _bad(path, f"{row[0]!r} is listed twice")
        seen.add(row[0])
        # Version 1 marked every entry strict, the other formats' (Pillow, OpenCV) included.
        if (row[5] if len(row) > 5 else row[4] in JPEG_BACKENDS) is True:
            out[row[0]] = row[3]
    return out


def expected_checksums(paths: Iterable[str], checksums: dict[str, int]) -> np.ndarray:
    """Per path, its verified CRC32C (``checksums``, from :func:`load_manifest`) or
    :data:`NOT_VERIFIED`, as int64 (for a :class:`~fastload.SharedArray`)."""
    return np.fromiter((checksums.get(p, NOT_VERIFIED) for p in paths), np.int64)


def _umask() -> int:
    """The process's umask (read by setting it back at once: no thread makes files meanwhile
    in the command that writes a manifest)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_manifest(path: str, rows: Sequence[list]) -> None:
    """Writes the manifest of ``rows`` to ``path`` atomically (a temporary file beside it, renamed)."""
    from . import __version__

    doc = {
        "format": FORMAT,
        "version": VERSION,
        "fastload": __version__,
        "strict": True,
        "checksum": "crc32c",
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "columns": COLUMNS,
        "files": list(rows),
    }
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        # mkstemp makes the file 0600: the manifest of a shared dataset folder must be readable
        # by those who read the images, so it gets the mode open() would have given it.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
