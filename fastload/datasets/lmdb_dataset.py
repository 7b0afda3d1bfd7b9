"""LMDB: fastload's own layout (raw encoded bytes, numpy metadata) or other tools' via ``parse=``."""

from __future__ import annotations

import io
import os
import threading
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..decode import MODULE_LIMIT, MaxPixels
from ..storage import StringArray
from .base import ImageDataset
from .lmdb_foreign import KEYS_KEY, as_key_set, listed_keys, pickled_sample, scan
from .lmdb_reader import close_readers, reader
from .lmdb_size import DataFile, check_data_file, check_still_whole
from .partial import check_complete

__all__ = ["LMDBDataset", "pickled_sample"]

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


def open_env(path: str, **options: Any):
    """This process's environment for ``path``, opened once and shared by all datasets.

    lmdb refuses a second open of one path in a process, and an environment inherited
    through fork must not be used; an inherited one is closed (in the child only) and
    reopened. The data file's size is checked against its header before lmdb maps it,
    and again on every later call, so a file cut short is an error, not SIGBUS.

    Raises:
        ValueError: The data file is shorter than its header says (truncated).
    """
    lmdb = _lmdb()
    real = os.path.realpath(path)
    pid = os.getpid()
    with _envs_lock:
        opened = _envs.get(real)
        if opened is not None and opened.pid == pid:
            check_still_whole(opened.data)
            return opened.env
        if opened is not None:
            opened.env.close()  # the parent's, copied by fork
            del _envs[real]
        data = check_data_file(path)
        env = lmdb.open(path, subdir=os.path.isdir(path), max_readers=4096, **options)
        _envs[real] = _Opened(pid, env, data)
        return env


def close_env(path: str) -> None:
    with _envs_lock:
        opened = _envs.pop(os.path.realpath(path), None)
    if opened is not None and opened.pid == os.getpid():
        opened.env.close()


def pack_meta(keys: StringArray, labels: np.ndarray, classes: list[str]) -> bytes:
    """The metadata record of fastload's layout: an .npz of plain arrays (no pickle)."""
    names = StringArray(classes)
    buf = io.BytesIO()
    np.savez(buf, version=np.int64(FORMAT_VERSION), count=np.int64(len(keys)), keys_data=keys.data,
             keys_offsets=keys.offsets, labels=np.asarray(labels, np.int64), classes_data=names.data,
             classes_offsets=names.offsets)
    return buf.getvalue()


def unpack_meta(value: bytes, path: str) -> tuple[StringArray, np.ndarray, list[str]]:
    try:
        with np.load(io.BytesIO(value), allow_pickle=False) as z:
            version = int(z["version"])
            if version > FORMAT_VERSION:
                raise ValueError(f"{path}: fastload LMDB format {version} is newer than this fastload "
                                 f"({FORMAT_VERSION}); upgrade fastload")
            keys = StringArray.from_buffer(z["keys_data"], z["keys_offsets"])
            labels = z["labels"].astype(np.int64)
            classes = list(StringArray.from_buffer(z["classes_data"], z["classes_offsets"]))
            count = int(z["count"])
    except (KeyError, OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # a damaged record
        if "newer" in str(e):
            raise
        raise ValueError(f"{path}: corrupt fastload metadata record: {e}") from e
    if not len(keys) == len(labels) == count:
        raise ValueError(f"{path}: metadata says {count} samples but has {len(keys)} keys, {len(labels)} labels")
    return keys, labels, classes


class LMDBDataset(ImageDataset):
    """Images stored in an LMDB.

    fastload's layout (written by ``tools/folder2lmdb.py``) holds each image's encoded
    bytes as they were on disk, and keys, labels and class names in a metadata record.
    Other tools' LMDBs are read by enumerating their keys once and turning each value
    into (image bytes, label) with ``parse`` (see :mod:`.lmdb_foreign` for which keys are
    samples, and the common "folder2lmdb" layout with its ``__keys__`` list).

    Reads happen in a reader process per reading thread (``isolate=True``, see
    :mod:`.lmdb_reader`): a data file truncated or corrupted under a running job is a
    ValueError naming the file and key, never SIGBUS or SIGSEGV in the training process.

    Args:
        path: The LMDB directory (or file, for ``subdir=False`` databases).
        transform: Applied to each decoded image.
        decoder: Decoder backend name; None picks the best available.
        parse: ``value -> (image bytes, label)`` for LMDBs not written by fastload.
            The value is a memoryview valid only during the call. It travels to the
            workers, so under spawn it must be picklable (a module-level function).
        allow_pickle: Unpickle values of foreign LMDBs (pickled (bytes, label) tuples or
            dicts) and their ``__keys__`` list. Off by default: unpickling runs arbitrary
            code from the file.
        exclude_keys: Keys of a foreign LMDB that are not samples (bytes or str); default:
            those that begin and end with ``__``. Not used when a ``__keys__`` list says
            which keys are samples.
        isolate: Read in a reader process (default). False reads in this process, zero-copy
            and a little faster, but a damaged data file can then kill it with a signal.
        buffers: Zero-copy reads (``isolate=False`` only); the image is decoded before the
            transaction ends.
        max_pixels: Pixel limit per image (see :class:`~fastload.datasets.base.ImageDataset`).
        **env_options: Passed to ``lmdb.open``; defaults are ``readonly=True, lock=False,
            readahead=False, meminit=False``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The LMDB is empty, foreign without ``parse``/``allow_pickle``, or its
            data file is empty or shorter than its header says (truncated; also raised by
            a read after the file shrank or was damaged).
    """

    def __init__(self, path: str | os.PathLike, transform: Any = None, *, decoder: str | None = None,
                 parse: Callable[[Any], tuple[Any, int]] | None = None, allow_pickle: bool = False,
                 exclude_keys: Iterable[bytes | str] | None = None, isolate: bool = True,
                 buffers: bool = True, max_pixels: MaxPixels = MODULE_LIMIT, **env_options: Any) -> None:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"LMDB {path!r} does not exist")
        check_complete(path)
        self.path, self.isolate = path, isolate
        self.env_options = {"readonly": True, "lock": False, "readahead": False, "meminit": False, **env_options}
        self.buffers = buffers
        self.classes: list[str] | None = None
        self._data = check_data_file(path)
        exclude = as_key_set(exclude_keys)
        get, items = self._access()
        try:
            meta = get(META_KEY)
            if meta is not None:
                keys, labels, classes = unpack_meta(bytes(meta), path)
                self.classes = classes
                self._parse = None
            else:
                if parse is None and not allow_pickle:
                    raise ValueError(
                        f"{path} was not written by fastload (no {META_KEY.decode()} record); pass "
                        "parse=lambda value: (image_bytes, label), or allow_pickle=True if its values "
                        "are pickled and you trust the file")
                self._parse = parse or pickled_sample
                raw = get(KEYS_KEY) if allow_pickle else None
                listed = listed_keys(bytes(raw), path) if raw is not None else None
                if listed is not None:  # the keys list names the samples: read only those
                    records = ((k, self._must(get, k)) for k in listed)
                    raw_keys, raw_labels = scan(records, self._parse, path, frozenset())
                else:
                    raw_keys, raw_labels = scan(self._progress(items()), self._parse, path, exclude)
                keys, labels = StringArray(raw_keys), np.asarray(raw_labels, dtype=np.int64)
        except _lmdb().Error as e:  # read in this process (isolate=False): name the file
            raise ValueError(f"LMDB {path}: {type(e).__name__}: {e} (the data file is damaged)") from e
        finally:
            self._close()  # workers open their own; nothing open travels through fork or pickle
        if len(keys) == 0:
            raise ValueError(f"LMDB {path!r} holds no samples")
        super().__init__(labels, transform, decoder, max_pixels=max_pixels)
        self.keys = keys

    def _access(self) -> tuple[Callable[[bytes], Any], Callable[[], Any]]:
        """(get(key), items()) for the constructor: through the reader, or one transaction."""
        if self.isolate:
            r = reader(self.path, self._data, self.env_options)
            return r.get, r.items
        txn = open_env(self.path, **self.env_options).begin()
        self._txn = txn
        return txn.get, lambda: iter(txn.cursor())

    def _close(self) -> None:
        txn = self.__dict__.pop("_txn", None)
        if txn is not None:
            txn.abort()
        if self.isolate:
            close_readers(self.path)
        else:
            close_env(self.path)

    def _must(self, get: Callable[[bytes], Any], key: bytes) -> Any:
        value = get(key)
        if value is None:
            raise ValueError(f"{self.path}: its {KEYS_KEY!r} list names key {key!r}, which is missing")
        return value

    def _progress(self, records: Any) -> Any:
        from tqdm import tqdm

        return tqdm(records, desc=f"indexing {self.path}", unit="rec", mininterval=2, delay=5)

    def describe(self, index: int) -> str:
        return f"{self.path} key {self.keys.get_bytes(index)!r}"

    def _missing(self, index: int) -> KeyError:
        return KeyError(f"{self.path}: key {self.keys.get_bytes(index)!r} (sample {index}) is missing")

    def _value(self, txn, index: int) -> Any:
        try:
            value = txn.get(self.keys.get_bytes(index))
        except _lmdb().Error as e:
            raise ValueError(f"LMDB {self.path}: reading key {self.keys.get_bytes(index)!r}: {type(e).__name__}: "
                             f"{e} (the data file is damaged)") from e
        if value is None:
            raise self._missing(index)
        return value

    def _split(self, value: Any, index: int) -> tuple[Any, int]:
        if self._parse is None:
            return value, int(self._labels.array[index])
        data, label = self._parse(value)
        return data, int(label)

    def _isolated(self, index: int) -> tuple[Any, int]:
        value = reader(self.path, self._data, self.env_options).get(self.keys.get_bytes(index))
        if value is None:
            raise self._missing(index)
        return self._split(value, index)

    def read(self, index: int) -> tuple[bytes, int]:
        self.check_index(index)
        if self.isolate:
            data, label = self._isolated(index)
            return bytes(data), label
        with open_env(self.path, **self.env_options).begin(buffers=self.buffers) as txn:
            data, label = self._split(self._value(txn, index), index)
            return bytes(data), label

    def load(self, index: int, epoch: int = 0, seed: int = 0, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        self.check_index(index)
        if self.isolate:
            data, label = self._isolated(index)
            return self.decode_sample(index, data, epoch, seed, out), label
        with open_env(self.path, **self.env_options).begin(buffers=self.buffers) as txn:
            data, label = self._split(self._value(txn, index), index)
            img = self.decode_sample(index, data, epoch, seed, out)
        # Decoders allocate their output, so nothing returned points into the map.
        return img, label

    def summary(self) -> dict:
        return {**super().summary(), "path": self.path, "layout": "fastload" if self._parse is None else "foreign"}
