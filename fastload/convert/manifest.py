"""``fastload verify DIR``: every image under a folder decoded strictly, the manifest of those that passed.

The manifest's format and its checks are :mod:`fastload.verified`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..datasets.folder import IMG_EXTENSIONS, _scan_files
from ..decode import JPEG_BACKENDS, DecodeError, decode_image, default_backend, is_jpeg
from ..system import available_cpus
from ..verified import crc32c, manifest_path, write_manifest

__all__ = ["VerifyReport", "verify_folder"]

CHUNK = 256  # files in flight at once while verifying


@dataclass
class VerifyReport:
    """What :func:`verify_folder` did.

    Attributes:
        manifest: The manifest written.
        verified: Files verified strictly (JPEGs; listed in it, marked strict).
        not_strict: Files of other formats, decoded by a decoder that is not strict (listed,
            marked not strict: not counted as verified by the datasets).
        failed: ``(relative path, why)`` of every file the strict decode refused (left out).
        bytes: Bytes decoded.
        seconds: Wall time.
    """

    manifest: str
    verified: int = 0
    not_strict: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0


def _verify_one(root: str, rel: str, backend: str) -> tuple[list | None, str | None, int]:
    """(manifest row or None, why it failed or None, bytes read) for file ``rel`` under ``root``."""
    path = os.path.join(root, rel)
    try:
        with open(path, "rb") as f:
            before = os.fstat(f.fileno())
            data = f.read()
            after = os.fstat(f.fileno())
    except OSError as e:
        return None, f"unreadable: {e}", 0
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or len(data) != after.st_size:
        return None, "changed while it was read", len(data)
    try:
        decode_image(data, backend=backend)
    except DecodeError as e:
        return None, str(e), len(data)
    except Exception as e:  # a decoder's own failure: the file is not verified either way
        return None, f"{type(e).__name__}: {e}", len(data)
    # Only the JPEG decoders are strict: another format's row is recorded, not counted as verified.
    strict = is_jpeg(data)
    decoder = backend if strict else "pillow/opencv"
    return [rel, len(data), after.st_mtime_ns, crc32c(data), decoder, strict], None, len(data)


def verify_folder(
    root: str | os.PathLike,
    *,
    manifest: str | os.PathLike | None = None,
    workers: int | None = None,
    progress: bool = True,
    extensions: Iterable[str] | None = None,
) -> VerifyReport:
    """Decodes every image file under ``root`` strictly and writes the manifest of those that passed.

    Args:
        root: The folder (an ImageFolder's root, or a list file's root).
        manifest: Where to write it (default :func:`manifest_path` of ``root``).
        workers: Decoding threads (default: the CPUs available).
        progress: Show a tqdm progress bar.
        extensions: File name endings to verify (default: ImageFolder's).

    Returns:
        The report; the files that failed are left out of the manifest.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: No strict JPEG decoder is available, ``workers`` is not a positive int, or
            ``root`` holds no image file.
    """
    from tqdm import tqdm

    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root!r} does not exist or is not a folder")
    backend = default_backend()
    if backend not in JPEG_BACKENDS:
        raise ValueError(
            f"the JPEG decoder here is {backend!r}, which is not strict: nothing can be verified "
            f"(`fastload info` says why; strict decoders: {', '.join(JPEG_BACKENDS)})"
        )
    if workers is None:
        workers = available_cpus()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    exts = tuple(e.lower() for e in (IMG_EXTENSIONS if extensions is None else extensions))
    out = os.fspath(manifest) if manifest is not None else manifest_path(root)
    files = _scan_files(root, exts, "")
    if not files:  # no manifest of nothing: an LMDB, shards or an empty folder is no image folder
        raise ValueError(
            f"no image files ({', '.join(exts)}) under {root!r}: `fastload verify` verifies an image folder; "
            "an LMDB, TFRecord or WebDataset is verified as it is written (the converters' --verify)"
        )
    report = VerifyReport(out)
    rows: list[list] = []
    start = time.perf_counter()
    with (
        ThreadPoolExecutor(workers) as pool,
        tqdm(total=len(files), desc=f"verify {root}", unit="images", disable=not progress) as bar,
    ):
        for first in range(0, len(files), CHUNK):
            for rel, (row, why, nbytes) in zip(
                files[first : first + CHUNK],
                pool.map(lambda r: _verify_one(root, r, backend), files[first : first + CHUNK]),
            ):
                report.bytes += nbytes
                if row is None:
                    report.failed.append((rel, why or "failed"))
                else:
                    rows.append(row)
                bar.update(1)
    write_manifest(out, rows)
    report.verified = sum(1 for row in rows if row[5])
    report.not_strict = len(rows) - report.verified
    report.seconds = time.perf_counter() - start
    return report
