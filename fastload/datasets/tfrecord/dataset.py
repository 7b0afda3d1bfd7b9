"""TFRecordDataset: random access to uncompressed TFRecord files through their indexes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from tqdm import tqdm

from ...decode import MODULE_LIMIT, MaxPixels
from ...verified import NOT_VERIFIED
from ..base import ImageDataset
from ..sampleplan import SamplePlan
from ..storage import SharedArray, StringArray
from .example import IMAGE_KEY, LABEL_KEY, example_fields
from .fdpool import MAX_OPEN_FILES, FilePool, stamp
from .files import expand_paths, load_meta
from .framing import TFRecordError, parse_record
from .index import load_index
from .verified import check_verified


def load_indexes(
    files: list[str], expected: dict[str, int], index_dir: str | None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The index of every file (validated, rebuilt when stale), checked against the sidecar counts."""
    indexes = []
    for path in tqdm(files, desc="reading TFRecord indexes", unit="file", delay=2):
        offsets, lengths, _ = load_index(path, index_dir)
        want = expected.get(path)
        if want is not None and want != len(offsets):
            raise ValueError(
                f"{path}: {len(offsets)} records, but the dataset's metadata sidecar says {want} "
                "(file cut short or replaced?)"
            )
        indexes.append((offsets, lengths))
    return indexes


class TFRecordDataset(ImageDataset):
    """Map-style access to uncompressed TFRecord files of ``tf.train.Example``.

    Indexes (``offset length`` lines) are built beside the data, or under ``index_dir``
    when that folder is read-only, and rebuilt when they no longer match their file. At
    most ``max_open_files`` descriptors are open per process.

    Args:
        paths_or_glob: A file, glob, folder of record files, or a list of them. Shard sets
            named ``*-NNNNN-of-MMMMM`` found through a folder or glob must be complete.
        transform: Applied to each decoded image.
        image_key: Feature holding the encoded image.
        label_key: Feature holding the int64 label.
        label_offset: Added to every label (-1 for TensorFlow's 1-based ImageNet labels).
        check_crc: Verify each record's data CRC (length CRCs are always checked; so are
            the data CRCs of verified records, see ``verified``).
        index_dir: Where to build missing indexes when the data folder is read-only.
        decoder: Decoder backend name; None picks the best available.
        max_open_files: Most file descriptors held open at once (per process).
        max_pixels: Pixel limit per image (see :class:`~fastload.datasets.base.ImageDataset`).
        verified: Use the checksums a converter's ``--verify`` recorded in the shard set's
            sidecar: a record whose data still has its CRC32C is decoded the cheapest way
            the crop allows, one whose data changed is refused ("the record changed since
            it was verified", naming file and byte offset), see :mod:`fastload.verified`.
            Records of files the sidecar has no checksums for are decoded strictly. False:
            every record decoded strictly.

    Attributes:
        classes: Class names from the metadata sidecar fastload's converter writes, else None.
        verified_by: Who verified the records ("fastload VERSION, strict, DECODER"), or "".

    Raises:
        FileNotFoundError: No such file, or a glob that matches nothing.
        TFRecordError: A file's framing is broken (names the file and byte offset).
        TypeError: ``verified`` is not a bool.
        ValueError: An incomplete shard set, GZIP files, no records at all, or a malformed sidecar.
    """

    _verified_what = "record"

    def __init__(
        self,
        paths_or_glob: Any,
        transform: Any = None,
        *,
        image_key: str = IMAGE_KEY,
        label_key: str = LABEL_KEY,
        label_offset: int = 0,
        check_crc: bool = True,
        index_dir: str | None = None,
        decoder: str | None = None,
        max_open_files: int = MAX_OPEN_FILES,
        max_pixels: MaxPixels = MODULE_LIMIT,
        verified: bool = True,
    ) -> None:
        if not isinstance(verified, bool):
            raise TypeError(f"verified must be True or False, got {verified!r}")
        files = expand_paths(paths_or_glob)
        for path in files:
            if path.endswith(".gz"):
                raise ValueError(f"{path} is compressed: use TFRecordStream for GZIP files")
        stamps = [stamp(os.stat(path)) for path in files]  # before indexing: a change after it is seen
        meta = load_meta(files)
        indexes = load_indexes(files, meta.counts, index_dir)
        self.classes: list[str] | None = meta.classes
        # Lengths match: load_indexes checked each file's count against the sidecar's, and
        # the sidecar's checksums against its counts.
        self._checksums: SharedArray | None = None
        if verified and meta.verified:
            unverified = [np.full(len(o), NOT_VERIFIED, np.int64) for o, _ in indexes]
            checks = [meta.verified.get(path, none) for path, none in zip(files, unverified)]
            self._checksums = SharedArray(np.concatenate(checks), np.int64)
        self.verified_by = meta.verified_by if self._checksums is not None else ""
        self.files = StringArray(files)
        self._file_ids = SharedArray(
            np.concatenate([np.full(len(o), i, np.int32) for i, (o, _) in enumerate(indexes)]), np.int32
        )
        self._offsets = SharedArray(np.concatenate([o for o, _ in indexes]), np.int64)
        self._lengths = SharedArray(np.concatenate([n for _, n in indexes]), np.int64)
        if len(self._offsets) == 0:
            raise ValueError(f"no records in {files}")
        self.image_key, self.label_key, self.label_offset = image_key, label_key, label_offset
        self.check_crc = check_crc
        self._pool = FilePool(self.files, max_open_files, stamps)
        # Labels live inside the records: read lazily (one pass) only when asked for.
        super().__init__(None, transform, decoder, max_pixels=max_pixels)

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def labels(self) -> np.ndarray:
        if self._labels is None:
            self._labels = SharedArray([self.read(i)[1] for i in range(len(self))], np.int64)
        return self._labels.array

    def describe(self, index: int) -> str:
        return f"{self.files[int(self._file_ids.array[index])]} record at byte {int(self._offsets.array[index])}"

    @property
    def verified_count(self) -> int:
        """How many records the converter verified strictly (0 when it did not, or ``verified=False``)."""
        return 0 if self._checksums is None else int((self._checksums.array != NOT_VERIFIED).sum())

    def verified_checksum(self, index: int) -> int:
        """The CRC32C record ``index``'s data (the serialized Example, not the image alone) had
        when the converter verified it, or NOT_VERIFIED."""
        return NOT_VERIFIED if self._checksums is None else int(self._checksums.array[index])

    def read(self, index: int) -> tuple[bytes, int]:
        image, label, _ = self._read(index, NOT_VERIFIED)
        return image, label

    def read_checked(self, index: int) -> tuple[bytes, int]:
        """As :meth:`read`, a verified record's data first checked against its checksum.

        Raises:
            ChangedSinceVerifiedError: The record's data changed since it was verified.
        """
        image, label, _ = self._read(index, self.verified_checksum(index))
        return image, label

    def plan(self, index: int, epoch: int = 0, seed: int = 0) -> SamplePlan:
        """As :meth:`ImageDataset.plan <fastload.ImageDataset.plan>`; a verified record's data
        is checked against its checksum while it is read (one CRC32C, the frame's).

        Raises:
            ChangedSinceVerifiedError: The record's data changed since it was verified.
            TFRecordError, DecodeError, IndexError: As for :meth:`read` and the base class.
        """
        self.check_index(index)
        image, label, verified = self._read(index, self.verified_checksum(index))
        return self._plan_bytes(index, image, label, epoch, seed, verified)

    def _read(self, index: int, expected: int) -> tuple[bytes, int, bool]:
        """(image, label, whether verified) of record ``index``; ``expected``: its verified CRC32C."""
        self.check_index(index)
        file_id = int(self._file_ids.array[index])
        offset, length = int(self._offsets.array[index]), int(self._lengths.array[index])
        buf = self._pool.pread(file_id, length, offset)
        path = self.files[file_id]
        if len(buf) < length:
            raise TFRecordError(
                path,
                offset,
                f"truncated record at byte {offset}: the index says {length} "
                f"bytes, the file has {len(buf)} (changed since it was opened?)",
            )
        where = f"{path} record at byte {offset}"
        # A verified record's CRC is computed below in any case: not twice.
        data = parse_record(buf, path, offset, self.check_crc and expected == NOT_VERIFIED)
        verified = check_verified(data, buf, expected, index, where, path, offset)
        image, label = example_fields(data, self.image_key, self.label_key, where)
        return image, label + self.label_offset, verified

    def close(self) -> None:
        """Closes this process's idle file descriptors (they reopen on the next read)."""
        self._pool.close()

    def summary(self) -> dict:
        return {
            "type": type(self).__name__,
            "samples": len(self),
            "paths": list(self.files),
            "classes": len(self.classes) if self.classes else None,
        }
