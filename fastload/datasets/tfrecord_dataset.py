"""TFRecord files of ``tf.train.Example``: map-style through index files, or streamed.

Record framing: uint64 length, masked crc32c of the length, data, masked crc32c of the
data. Index files use the tfrecord package's text format, one ``offset length`` line per
record.
"""

from __future__ import annotations

import glob
import hashlib
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info
from tqdm import tqdm

from ..storage import SharedArray, StringArray
from .base import ImageDataset

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
INDEX_SUFFIX = ".idx"


def _crc32c():
    try:
        import crc32c
    except ImportError as e:
        raise ImportError("TFRecord support needs crc32c: pip install tfrecord") from e
    return crc32c.crc32c


def masked_crc(data: Any) -> int:
    crc = _crc32c()(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def example_pb2():
    try:
        from tfrecord import example_pb2 as pb
    except ImportError as e:
        raise ImportError("TFRecord support needs the tfrecord package: pip install tfrecord") from e
    return pb


def expand_paths(paths_or_glob: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Files named by a path, a glob, a folder of record files, or a list of those."""
    items = [paths_or_glob] if isinstance(paths_or_glob, (str, os.PathLike)) else list(paths_or_glob)
    files: list[str] = []
    for item in map(os.fspath, items):
        if os.path.isdir(item):
            found = sorted(os.path.join(item, f) for f in os.listdir(item)
                           if not f.endswith((INDEX_SUFFIX, ".index")) and not f.startswith("."))
        elif any(c in item for c in "*?["):
            found = sorted(f for f in glob.glob(item) if not f.endswith((INDEX_SUFFIX, ".index")))
        else:
            if not os.path.isfile(item):
                raise FileNotFoundError(f"TFRecord file {item!r} does not exist")
            found = [item]
        if not found:
            raise FileNotFoundError(f"no TFRecord files match {item!r}")
        files.extend(found)
    return files


def parse_record(buf: Any, path: str, offset: int, check_data_crc: bool = True) -> memoryview:
    """The data of one framed record in ``buf``; CRC errors name file and offset."""
    view = memoryview(buf)
    if len(view) < 16:
        raise ValueError(f"{path}: truncated record at byte {offset} ({len(view)} bytes)")
    length, length_crc = struct.unpack_from("<QI", view)
    if masked_crc(view[:8]) != length_crc:
        raise ValueError(f"{path}: length CRC mismatch at byte {offset} (corrupt file or wrong index)")
    if len(view) < 16 + length:
        raise ValueError(f"{path}: truncated record at byte {offset}: needs {16 + length} bytes, has {len(view)}")
    data = view[12 : 12 + length]
    if check_data_crc and masked_crc(data) != struct.unpack_from("<I", view, 12 + length)[0]:
        raise ValueError(f"{path}: data CRC mismatch in record at byte {offset}")
    return data


def iter_records(fileobj, path: str, check_data_crc: bool = True) -> Iterator[tuple[int, memoryview]]:
    """(offset, data) for each record of an open (possibly gzip) file, in order."""
    offset = 0
    while True:
        head = fileobj.read(12)
        if not head:
            return
        if len(head) < 12:
            raise ValueError(f"{path}: truncated record header at byte {offset}")
        length = struct.unpack_from("<Q", head)[0]
        rest = fileobj.read(length + 4)
        yield offset, parse_record(head + rest, path, offset, check_data_crc)
        offset += 16 + length


def example_fields(data: Any, image_key: str, label_key: str, where: str) -> tuple[bytes, int]:
    ex = example_pb2().Example.FromString(bytes(data))
    feats = ex.features.feature
    missing = [k for k in (image_key, label_key) if k not in feats]
    if missing:
        raise KeyError(f"{where}: feature {missing[0]!r} not in record; it has {sorted(feats)}")
    images = feats[image_key].bytes_list.value
    labels = feats[label_key].int64_list.value
    if not images or not labels:
        raise KeyError(f"{where}: {image_key!r} must be bytes and {label_key!r} int64")
    return images[0], int(labels[0])


def index_path(data_path: str, cache_dir: str | None = None) -> str:
    """Where the index of ``data_path`` is: beside it if present or writable, else in a cache."""
    for beside in (data_path + INDEX_SUFFIX, data_path + ".index"):
        if os.path.exists(beside):
            return beside
    if os.access(os.path.dirname(os.path.abspath(data_path)), os.W_OK):
        return data_path + INDEX_SUFFIX
    cache = cache_dir or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                      "fastload", "tfrecord-index")
    st = os.stat(data_path)
    key = f"{os.path.abspath(data_path)}:{st.st_size}:{st.st_mtime_ns}".encode()
    return os.path.join(cache, hashlib.sha256(key).hexdigest()[:20] + INDEX_SUFFIX)


def build_index(data_path: str, out_path: str) -> None:
    """Writes ``offset length`` lines for every record (checking length CRCs only)."""
    lines = []
    with open(data_path, "rb") as f:
        for offset, data in iter_records(f, data_path, check_data_crc=False):
            lines.append(f"{offset} {16 + len(data)}\n")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = f"{out_path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(lines)
    os.replace(tmp, out_path)


def read_index(path: str) -> tuple[np.ndarray, np.ndarray]:
    table = np.loadtxt(path, dtype=np.int64, ndmin=2) if os.path.getsize(path) else np.zeros((0, 2), np.int64)
    if table.shape[1] != 2:
        raise ValueError(f"{path}: index lines must be 'offset length'")
    return table[:, 0].copy(), table[:, 1].copy()


class TFRecordDataset(ImageDataset):
    """Map-style access to uncompressed TFRecord files of ``tf.train.Example``.

    Args:
        paths_or_glob: A file, glob, folder of record files, or a list of them.
        transform: Applied to each decoded image.
        image_key: Feature holding the encoded image.
        label_key: Feature holding the int64 label.
        label_offset: Added to every label (-1 for TensorFlow's 1-based ImageNet labels).
        check_crc: Verify each record's data CRC (length CRCs are always checked).
        index_dir: Where to build missing indexes when the data folder is read-only.
        decoder: Decoder backend name; None picks the best available.
    """

    def __init__(self, paths_or_glob: Any, transform: Any = None, *, image_key: str = IMAGE_KEY,
                 label_key: str = LABEL_KEY, label_offset: int = 0, check_crc: bool = True,
                 index_dir: str | None = None, decoder: str | None = None) -> None:
        files = expand_paths(paths_or_glob)
        for path in files:
            if path.endswith(".gz"):
                raise ValueError(f"{path} is compressed: use TFRecordStream for GZIP files")
        indexes = [index_path(path, index_dir) for path in files]
        missing = [(p, i) for p, i in zip(files, indexes) if not os.path.exists(i)]
        for path, idx in tqdm(missing, desc="indexing TFRecord files", unit="file", disable=len(missing) < 2):
            build_index(path, idx)
        file_ids, offsets, lengths = [], [], []
        for i, idx in enumerate(indexes):
            off, length = read_index(idx)
            file_ids.append(np.full(len(off), i, np.int32))
            offsets.append(off)
            lengths.append(length)
        self.files = StringArray(files)
        self._file_ids = SharedArray(np.concatenate(file_ids), np.int32)
        self._offsets = SharedArray(np.concatenate(offsets), np.int64)
        self._lengths = SharedArray(np.concatenate(lengths), np.int64)
        if len(self._offsets) == 0:
            raise ValueError(f"no records in {files}")
        self.image_key, self.label_key, self.label_offset = image_key, label_key, label_offset
        self.check_crc = check_crc
        self._fds: dict[int, int] = {}
        self._fd_pid = os.getpid()
        # Labels live inside the records: read lazily (one pass) only when asked for.
        super().__init__(None, transform, decoder)

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def labels(self) -> np.ndarray:
        if self._labels is None:
            self._labels = SharedArray([self.read(i)[1] for i in range(len(self))], np.int64)
        return self._labels.array

    def describe(self, index: int) -> str:
        return f"{self.files[int(self._file_ids.array[index])]} record at byte {int(self._offsets.array[index])}"

    def _fd(self, file_id: int) -> int:
        if self._fd_pid != os.getpid():  # descriptors inherited through fork share offsets: reopen
            self._fds, self._fd_pid = {}, os.getpid()
        fd = self._fds.get(file_id)
        if fd is None:
            fd = self._fds[file_id] = os.open(self.files[file_id], os.O_RDONLY)
        return fd

    def read(self, index: int) -> tuple[bytes, int]:
        self.check_index(index)
        file_id = int(self._file_ids.array[index])
        offset, length = int(self._offsets.array[index]), int(self._lengths.array[index])
        buf = os.pread(self._fd(file_id), length, offset)
        path = self.files[file_id]
        data = parse_record(buf, path, offset, self.check_crc)
        image, label = example_fields(data, self.image_key, self.label_key, f"{path} record at byte {offset}")
        return image, label + self.label_offset

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fds"] = {}
        return state

    def summary(self) -> dict:
        return {"type": type(self).__name__, "samples": len(self), "paths": list(self.files)}


class TFRecordStream(IterableDataset):
    """Streams records in file order, sharded by (rank, worker): each record exactly once.

    For GZIP-compressed files (``.gz`` or ``compression="gzip"``) and for uncompressed
    files read sequentially. Yields decoded, transformed (image, label) samples; the
    Loader batches them.

    Args:
        paths_or_glob: A file, glob, folder of record files, or a list of them.
        transform: Applied to each decoded image.
        image_key, label_key, label_offset, check_crc, decoder: As for TFRecordDataset.
        compression: "gzip", None (plain) or "auto" (by the .gz suffix).
    """

    def __init__(self, paths_or_glob: Any, transform: Any = None, *, image_key: str = IMAGE_KEY,
                 label_key: str = LABEL_KEY, label_offset: int = 0, check_crc: bool = True,
                 compression: str | None = "auto", decoder: str | None = None) -> None:
        if compression not in ("auto", "gzip", None):
            raise ValueError(f"compression must be 'auto', 'gzip' or None, got {compression!r}")
        self.files = StringArray(expand_paths(paths_or_glob))
        self.image_key, self.label_key, self.label_offset = image_key, label_key, label_offset
        self.check_crc, self.compression = check_crc, compression
        self._proto = ImageDataset(None, transform, decoder)  # decode + transform
        self.epoch, self.seed, self.rank, self.world_size = 0, 0, 0, 1

    def shard(self, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} must be in [0, {world_size})")
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _open(self, path: str):
        gz = self.compression == "gzip" or (self.compression == "auto" and path.endswith(".gz"))
        if gz:
            import gzip

            return gzip.open(path, "rb")
        return open(path, "rb")

    def records(self) -> Iterator[tuple[int, str, int, bytes, int]]:
        """(global record number, file, offset, image bytes, label) of this shard."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        total, me = self.world_size * workers, self.rank * workers + worker
        n = 0
        for path in self.files:
            with self._open(path) as f:
                for offset, data in iter_records(f, path, self.check_crc):
                    if n % total == me:
                        where = f"{path} record at byte {offset}"
                        image, label = example_fields(data, self.image_key, self.label_key, where)
                        yield n, path, offset, image, label + self.label_offset
                    n += 1

    def decode(self, n: int, image: bytes) -> np.ndarray:
        return self._proto.decode_sample(n, image, self.epoch, self.seed)

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        for n, _, _, image, label in self.records():
            yield self.decode(n, image), label
