"""LMDB: fastload's own layout (raw encoded bytes, numpy metadata) or other tools' via ``parse=``."""

from __future__ import annotations

import io
import os
import threading
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..decode import MODULE_LIMIT, MaxPixels
from ..verified import NOT_VERIFIED
from .base import ImageDataset
from .lmdb_foreign import DEFAULT_EXCLUDED, as_key_set, listed_keys, pickled_sample, scan
from .lmdb_guard import DEFAULT_TIMEOUT_S
from .lmdb_guard_registry import guard_for
from .lmdb_lock import MAX_READERS, reserve_lock_file
from .lmdb_size import DataFile, check_data_file, check_same_file, check_still_whole
from .partial import check_complete
from .storage import SharedArray, StringArray

META_KEY = b"__fastload_meta__"
FORMAT_VERSION = 1


@dataclass
class _Opened:
    """An environment opened by process ``pid``, and what its data file must hold."""

    pid: int
    env: Any
    data: DataFile | None


_envs: dict[str, _Opened] = {}
_envs_lock = threading.Lock()


def _lmdb():
    try:
        import lmdb
    except ImportError as e:
        raise ImportError("LMDB support needs the lmdb package: pip install lmdb") from e
    return lmdb


def open_env(path: str, data: DataFile | None, **options: Any):
    """This process's environment for ``path``, opened once and shared by all datasets.

    lmdb refuses a second open of one path in a process, and an environment inherited
    through fork must not be used; an inherited one is closed (in the child only) and
    reopened. ``data`` is the data file as the dataset opened it: the file is checked
    against it on every call (one ``stat``: cut short, replaced or written to is an
    error, not SIGBUS or another file's samples), and in full when a process opens it.

    Raises:
        ValueError: The data file is shorter than its header says (truncated).
        LMDBChangedError: It was replaced or written to since ``data`` was taken.
        OSError: ``lock=True`` and no space left for the lock file (named).
    """
    lmdb = _lmdb()
    real = os.path.realpath(path)
    pid = os.getpid()
    check_still_whole(data)
    with _envs_lock:
        opened = _envs.get(real)
        if opened is not None and opened.pid == pid and (opened.data is None or opened.data.same_file(data)):
            return opened.env
        if opened is not None:
            # The parent's, copied by fork (close it in this child only), or the environment of
            # another dataset of a file since replaced (whose own reads now fail their check).
            opened.env.close()
            del _envs[real]
        reserve_lock_file(path, options)
        env = lmdb.open(path, subdir=os.path.isdir(path), max_readers=MAX_READERS, **options)
        try:
            check_same_file(data)  # the file lmdb has just mapped is the one the dataset indexed
        except ValueError:
            env.close()
            raise
        _envs[real] = _Opened(pid, env, data)
        return env


def close_env(path: str) -> None:
    with _envs_lock:
        opened = _envs.pop(os.path.realpath(path), None)
    if opened is not None and opened.pid == os.getpid():
        opened.env.close()


def pack_meta(
    keys: StringArray,
    labels: np.ndarray,
    classes: list[str],
    verified: np.ndarray | None = None,
    verified_by: str = "",
) -> bytes:
    """The metadata record of fastload's layout: an .npz of plain arrays (no pickle).

    ``verified``: per record, the CRC32C of its bytes when a strict decode accepted them, or
    :data:`fastload.verified.NOT_VERIFIED` (a converter's ``--verify``), with ``verified_by``
    ("fastload VERSION, strict, DECODER"); readers that predate them ignore both."""
    names = StringArray(classes)
    extra = {}
    if verified is not None:
        extra = {
            "verified_crc32c": np.asarray(verified, np.int64),
            "verified_by": np.frombuffer(verified_by.encode(), np.uint8),
        }
    buf = io.BytesIO()
    np.savez(
        buf,
        version=np.int64(FORMAT_VERSION),
        count=np.int64(len(keys)),
        keys_data=keys.data,
        keys_offsets=keys.offsets,
        labels=np.asarray(labels, np.int64),
        classes_data=names.data,
        classes_offsets=names.offsets,
        **extra,
    )
    return buf.getvalue()


#: What np.load of a damaged .npz raises (a cut zip: BadZipFile; a cut member: EOFError).
_CORRUPT = (KeyError, OSError, ValueError, EOFError, zipfile.BadZipFile)


def unpack_verified(value: bytes, path: str, count: int) -> tuple[np.ndarray | None, str]:
    """The per-record verified CRC32Cs (int64, NOT_VERIFIED where not) and who verified them,
    from the metadata record ``value``; (None, "") where the converter did not verify.

    Raises:
        ValueError: They are malformed (named).
    """
    try:
        with np.load(io.BytesIO(value), allow_pickle=False) as z:
            if "verified_crc32c" not in z.files:
                return None, ""
            crcs, by = z["verified_crc32c"], z["verified_by"]
    except _CORRUPT as e:
        raise ValueError(f"{path}: corrupt fastload metadata record: {type(e).__name__}: {e}") from e
    if crcs.dtype != np.int64 or crcs.shape != (count,) or by.dtype != np.uint8 or by.ndim != 1:
        raise ValueError(f"{path}: corrupt fastload metadata record: verified checksums {crcs.dtype}{crcs.shape}")
    if count and (crcs.min() < NOT_VERIFIED or crcs.max() > 0xFFFFFFFF):
        raise ValueError(f"{path}: corrupt fastload metadata record: a verified checksum out of range")
    return crcs, by.tobytes().decode(errors="replace")


def unpack_meta(value: bytes, path: str) -> tuple[StringArray, np.ndarray, list[str]]:
    try:
        with np.load(io.BytesIO(value), allow_pickle=False) as z:
            version = int(z["version"])
            if version <= FORMAT_VERSION:
                keys = StringArray.from_buffer(z["keys_data"], z["keys_offsets"])
                labels = z["labels"].astype(np.int64)
                classes = list(StringArray.from_buffer(z["classes_data"], z["classes_offsets"]))
                count = int(z["count"])
    except _CORRUPT as e:
        raise ValueError(f"{path}: corrupt fastload metadata record: {type(e).__name__}: {e}") from e
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{path}: fastload LMDB format {version} is newer than this fastload ({FORMAT_VERSION}); upgrade fastload"
        )
    if not len(keys) == len(labels) == count:
        raise ValueError(f"{path}: metadata says {count} samples but has {len(keys)} keys, {len(labels)} labels")
    return keys, labels, classes


class LMDBDataset(ImageDataset):
    """Images stored in an LMDB.

    fastload's layout (written by ``tools/folder2lmdb.py``) holds each image's encoded
    bytes as they were on disk, and keys, labels and class names in a metadata record.
    Other tools' LMDBs are read by enumerating their keys once and turning each value
    into (image bytes, label) with ``parse``. The common "folder2lmdb" layout (pickled
    ``(bytes, label)`` under ``b'0'``, ``b'1'``, ... plus ``b'__keys__'`` and
    ``b'__len__'``) reads with ``allow_pickle=True``: its ``__keys__`` record says which
    keys are samples.

    Args:
        path: The LMDB directory (or file, for ``subdir=False`` databases).
        transform: Applied to each decoded image.
        decoder: Decoder backend name; None picks the best available.
        parse: ``value -> (image bytes, label)`` for LMDBs not written by fastload.
            The value is a memoryview valid only during the call. It travels to the
            workers, so under spawn it must be picklable (a module-level function).
        allow_pickle: Unpickle values of foreign LMDBs (pickled (bytes, label) tuples or
            dicts, and a folder2lmdb ``__keys__`` list). Off by default: unpickling runs
            arbitrary code from the file.
        exclude_keys: Keys of a foreign LMDB that are not samples (bytes, or str as
            UTF-8). By default (None) folder2lmdb's ``b'__keys__'`` and ``b'__len__'``,
            and with ``allow_pickle`` the ``__keys__`` list says which keys are samples.
            Given, every key but these is a sample (``()``: every key), in key order.
        guard: Read through a guard process (:mod:`fastload.datasets.lmdb_guard`), so a
            data file cut short in use (SIGBUS) or a damaged B-tree page (SIGSEGV) is an
            :class:`~fastload.datasets.lmdb_guard.LMDBReadError` instead of killing the
            training process. None (default): everywhere except in the process backend's
            workers, whose crash is already a named WorkerFailure (so: with the thread
            backend, without workers, and in this constructor). False: read the map
            directly everywhere (files you trust; saves a copy and a pipe round trip per
            read).
        guard_timeout: Seconds a read through the guard may wait for its answer before the
            guard is taken for hung (stopped, stuck on a dead network filesystem): it is
            killed and the read tried once more by a new one. A Loader's ``timeout`` and
            ``close()`` end a wait sooner. This dataset's reads only: datasets of one LMDB
            share its guard, each read waiting as long as its own dataset says.
        buffers: Zero-copy reads: the image bytes are copied once, out of the map, in the transaction.
        max_pixels: Pixel limit per image (see :class:`~fastload.datasets.base.ImageDataset`).
        verified: Use the checksums a converter's ``--verify`` recorded (fastload's layout):
            a record whose bytes still have its CRC32C is decoded the cheapest way the crop
            allows, one whose bytes changed is refused ("the record changed since it was
            verified"), see :mod:`fastload.verified`. False: every record decoded strictly.
        **env_options: Passed to ``lmdb.open``; defaults are ``readonly=True, lock=False,
            readahead=False, meminit=False``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The LMDB is empty, foreign without ``parse``/``allow_pickle``, or its
            data file is empty or shorter than its header says (truncated; also raised
            by a read after the file shrank). LMDBReadError (a ValueError) when a read
            killed the guard process. LMDBChangedError (a ValueError) from a read after
            the data file was replaced or written to (with ``lock=True``: replaced).
        OSError: ``lock=True`` and the disk of the lock file is full (ENOSPC, named).
        TypeError: ``verified`` is not True or False, or ``guard`` not None, True or False.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Any = None,
        *,
        decoder: str | None = None,
        parse: Callable[[Any], tuple[Any, int]] | None = None,
        allow_pickle: bool = False,
        exclude_keys: Iterable[bytes | str] | None = None,
        guard: bool | None = None,
        guard_timeout: float = DEFAULT_TIMEOUT_S,
        buffers: bool = True,
        max_pixels: MaxPixels = MODULE_LIMIT,
        verified: bool = True,
        **env_options: Any,
    ) -> None:
        if not isinstance(verified, bool):
            raise TypeError(f"verified must be True or False, got {verified!r}")
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"LMDB {path!r} does not exist")
        check_complete(path)
        excluded = as_key_set(DEFAULT_EXCLUDED if exclude_keys is None else exclude_keys)
        self.path = path
        self.env_options = {"readonly": True, "lock": False, "readahead": False, "meminit": False, **env_options}
        self.buffers = buffers
        if guard not in (None, True, False):
            raise TypeError(f"guard must be None, True or False, got {guard!r}")
        self.guard = guard
        if isinstance(guard_timeout, bool) or not isinstance(guard_timeout, (int, float)) or not guard_timeout > 0:
            raise ValueError(f"guard_timeout must be a number of seconds > 0, got {guard_timeout!r}")
        self.guard_timeout = float(guard_timeout)
        writers = bool(self.env_options["lock"]) or not self.env_options["readonly"]
        # What the data file is now: every process checks it reads this one (see lmdb_size).
        self.data = check_data_file(path, writers)
        self.classes: list[str] | None = None
        self._verified: np.ndarray | None = None
        self.verified_by = ""
        if self._guarded():
            reader, timeout = self._guard_of(), self.guard_timeout
            get, items = partial(reader.get, timeout=timeout), partial(reader.items, timeout=timeout)
            keys, labels = self._index(get, items, 0, parse, allow_pickle, exclude_keys, excluded)
        else:
            env = open_env(path, self.data, **self.env_options)
            with env.begin() as txn:
                keys, labels = self._index(
                    txn.get, txn.cursor, txn.stat()["entries"], parse, allow_pickle, exclude_keys, excluded
                )
            close_env(path)  # workers open their own; nothing open travels through fork or pickle
        if len(keys) == 0:
            raise ValueError(f"LMDB {path!r} holds no samples")
        super().__init__(labels, transform, decoder, max_pixels=max_pixels)
        self.keys = keys
        found, self._verified = self._verified, None
        self._checksums = SharedArray(found) if verified and found is not None else None

    _verified_what = "record"

    @property
    def verified_count(self) -> int:
        """How many records the converter verified strictly (0 when it did not, or ``verified=False``)."""
        return 0 if self._checksums is None else int((self._checksums.array != NOT_VERIFIED).sum())

    def verified_checksum(self, index: int) -> int:
        """The CRC32C a converter's ``--verify`` recorded for record ``index``, or NOT_VERIFIED."""
        return NOT_VERIFIED if self._checksums is None else int(self._checksums.array[index])

    def _index(
        self,
        get: Callable[[bytes], Any],
        items: Callable[[], Iterable[Any]],
        total: int,
        parse: Callable[[Any], tuple[Any, int]] | None,
        allow_pickle: bool,
        exclude_keys: Iterable[bytes | str] | None,
        excluded: frozenset[bytes],
    ) -> tuple[StringArray, np.ndarray]:
        meta = get(META_KEY)
        if meta is not None:
            keys, labels, self.classes = unpack_meta(meta, self.path)
            self._verified, self.verified_by = unpack_verified(meta, self.path, len(keys))
            self._parse = None
            return keys, labels
        if parse is None and not allow_pickle:
            raise ValueError(
                f"{self.path} was not written by fastload (no {META_KEY.decode()} record); pass "
                "parse=lambda value: (image_bytes, label), or allow_pickle=True if its values "
                "are pickled and you trust the file"
            )
        self._parse = parse or pickled_sample
        listed = listed_keys(get, self.path, allow_pickle and exclude_keys is None)
        return scan(get, items, total, self.path, self._parse, listed, excluded)

    def _guarded(self) -> bool:
        """Whether reads here go through the guard process (see ``guard``)."""
        if self.guard is not None:
            return self.guard
        from torch.utils.data import get_worker_info

        return get_worker_info() is None

    def _guard_of(self):
        return guard_for(self.path, self.env_options, self.data)

    def _guarded_value(self, index: int) -> bytes:
        key = self.keys.get_bytes(index)
        value = self._guard_of().get(key, self.guard_timeout)
        if value is None:
            raise KeyError(f"{self.path}: key {key!r} (sample {index}) is missing")
        return value

    def describe(self, index: int) -> str:
        return f"{self.path} key {self.keys.get_bytes(index)!r}"

    def _value(self, txn, index: int) -> Any:
        key = self.keys.get_bytes(index)
        value = txn.get(key)
        if value is None:
            raise KeyError(f"{self.path}: key {key!r} (sample {index}) is missing")
        return value

    def _split(self, value: Any, index: int) -> tuple[Any, int]:
        if self._parse is None:
            return value, int(self._labels.array[index])
        data, label = self._parse(value)
        return data, int(label)

    def read(self, index: int) -> tuple[bytes, int]:
        self.check_index(index)
        if self._guarded():
            data, label = self._split(self._guarded_value(index), index)
            return bytes(data), label
        with open_env(self.path, self.data, **self.env_options).begin(buffers=self.buffers) as txn:
            data, label = self._split(self._value(txn, index), index)
            return bytes(data), label

    def summary(self) -> dict:
        return {**super().summary(), "path": self.path, "layout": "fastload" if self._parse is None else "foreign"}
