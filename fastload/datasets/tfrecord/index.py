"""Record indexes (``offset length`` lines, the tfrecord package's format) and GZIP record counts.

An index is used only when it describes its data file exactly: offsets start at 0, each
record starts where the previous ends, and the last ends at the file's size. Anything
else (an empty index for a non-empty file, a file rewritten or cut since) is stale and
rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings

import numpy as np

from .files import INDEX_SUFFIX
from .framing import OVERHEAD, TFRecordError, iter_records


def cache_folder(kind: str, cache_dir: str | None = None) -> str:
    """``cache_dir`` when given, else ``~/.cache/fastload/<kind>`` (honouring XDG_CACHE_HOME)."""
    if cache_dir:
        return cache_dir
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastload", kind)


def _cache_file(data_path: str, folder: str, suffix: str) -> str:
    st = os.stat(data_path)
    key = f"{os.path.abspath(data_path)}:{st.st_size}:{st.st_mtime_ns}".encode()
    return os.path.join(folder, hashlib.sha256(key).hexdigest()[:20] + suffix)


def index_candidates(data_path: str, index_dir: str | None = None) -> list[str]:
    """Where an index of ``data_path`` may be, in the order they are tried."""
    return [
        data_path + INDEX_SUFFIX,
        data_path + ".index",
        _cache_file(data_path, cache_folder("tfrecord-index", index_dir), INDEX_SUFFIX),
    ]


def index_problem(offsets: np.ndarray, lengths: np.ndarray, size: int) -> str | None:
    """Why (offsets, lengths) is not an index of a file of ``size`` bytes; None when it is."""
    if len(offsets) == 0:
        return None if size == 0 else f"no records listed for a file of {size} bytes"
    if offsets[0] != 0:
        return f"the first record starts at byte {offsets[0]}, not 0"
    if lengths.min() < OVERHEAD:
        return f"a record length of {lengths.min()} is shorter than a record's framing"
    gaps = np.flatnonzero(offsets[1:] != offsets[:-1] + lengths[:-1])
    if len(gaps):
        return f"record {gaps[0] + 1} does not start where record {gaps[0]} ends"
    end = int(offsets[-1] + lengths[-1])
    if end != size:
        return f"the records end at byte {end} but the file has {size} bytes"
    return None


def read_index(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) from an index file; ValueError if it is not ``offset length`` lines."""
    if os.path.getsize(path) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    try:
        table = np.loadtxt(path, dtype=np.int64, ndmin=2)
    except ValueError as e:
        raise ValueError(f"{path}: index lines must be 'offset length': {e}") from e
    if table.shape[1] != 2:
        raise ValueError(f"{path}: index lines must be 'offset length'")
    return table[:, 0].copy(), table[:, 1].copy()


def write_index(path: str, offsets: np.ndarray, lengths: np.ndarray) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(f"{o} {n}\n" for o, n in zip(offsets.tolist(), lengths.tolist()))
    os.replace(tmp, path)


def scan_index(data_path: str) -> tuple[np.ndarray, np.ndarray, TFRecordError | None]:
    """(offsets, lengths, error) of the records, reading only headers (length CRCs checked).

    A broken file gives the records before the break and the TFRecordError naming it.
    """
    size = os.path.getsize(data_path)
    offsets: list[int] = []
    error = None
    with open(data_path, "rb") as f:
        try:
            for offset, _ in iter_records(f, data_path, size, skip=1 << 62):
                offsets.append(offset)
        except TFRecordError as e:
            error = e
    end = size if error is None else error.offset
    lengths = np.diff(np.asarray(offsets + [end], np.int64))
    return np.asarray(offsets, np.int64), lengths, error


def load_index(
    data_path: str, index_dir: str | None = None, *, allow_broken: bool = False
) -> tuple[np.ndarray, np.ndarray, TFRecordError | None]:
    """The index of ``data_path``: a stored one that matches the file, or a fresh one.

    A fresh index is written beside the data when that folder is writable, else under
    ``index_dir`` (default ``~/.cache/fastload``); when neither can be written it is kept
    in memory with a warning.

    Returns:
        (offsets, lengths, error): ``error`` is None unless ``allow_broken`` and the file's
        framing breaks; then the index covers the records before the break and is not stored.

    Raises:
        TFRecordError: The file is broken (and not ``allow_broken``).
    """
    size = os.path.getsize(data_path)
    stale = []
    for path in index_candidates(data_path, index_dir):
        if not os.path.isfile(path):
            continue
        try:
            offsets, lengths = read_index(path)
            problem = index_problem(offsets, lengths, size)
        except ValueError as e:
            problem = str(e)
        if problem is None:
            return offsets, lengths, None
        stale.append(f"{path} ({problem})")
    if stale:
        warnings.warn(f"fastload: stale TFRecord index {'; '.join(stale)}: rebuilding", RuntimeWarning, stacklevel=3)
    offsets, lengths, broken = scan_index(data_path)
    if broken is not None:
        if not allow_broken:
            raise broken
        return offsets, lengths, broken
    beside, _, cached = index_candidates(data_path, index_dir)
    writable = os.access(os.path.dirname(os.path.abspath(data_path)), os.W_OK)
    for target in ([beside] if writable else []) + [cached]:
        try:
            write_index(target, offsets, lengths)
            return offsets, lengths, None
        except OSError as e:
            error = e
    warnings.warn(
        f"fastload: cannot write an index of {data_path} ({error}); keeping it in memory", RuntimeWarning, stacklevel=3
    )
    return offsets, lengths, None


def count_records(data_path: str, open_file, cache_dir: str | None = None) -> tuple[int, TFRecordError | None]:
    """Records in a file read sequentially (GZIP), by one counting pass cached per (path, size, mtime).

    Returns:
        (count, error): a file whose framing breaks counts the records before the break
        plus one for the broken record, and ``error`` says where it broke.
    """
    cache = _cache_file(data_path, cache_folder("tfrecord-counts", cache_dir), ".count.json")
    try:
        with open(cache, encoding="utf-8") as f:
            saved = json.load(f)
        count, broken = saved["records"], saved["broken"]
        if isinstance(count, int) and count >= 0 and (broken is None or isinstance(broken, list)):
            return count, None if broken is None else TFRecordError(data_path, broken[0], broken[1])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass  # no cache yet, or one from an older fastload: count again
    count, error = 0, None
    with open_file(data_path) as f:
        try:
            for _ in iter_records(f, data_path, None, skip=1 << 62):
                count += 1
        except TFRecordError as e:
            count, error = count + 1, e
    saved = {
        "path": os.path.abspath(data_path),
        "records": count,
        "broken": None if error is None else [error.offset, error.problem],
    }
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(f"{cache}.tmp{os.getpid()}", "w", encoding="utf-8") as f:
            json.dump(saved, f)
        os.replace(f"{cache}.tmp{os.getpid()}", cache)
    except OSError:
        pass  # an unwritable cache costs a recount next time, nothing else
    return count, error
