"""TFRecordStream: records read in file order, split into equal slots (rank × worker), each read once."""

from __future__ import annotations

import contextlib
import gzip
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from ...decode import MODULE_LIMIT, MaxPixels, get_decoder, resolve_max_pixels
from ...transforms import as_compose
from ...verified import NOT_VERIFIED, ChangedSinceVerifiedError
from ..protocols import StreamTraits
from ..records import PlannedRecords
from ..storage import SharedArray, StringArray
from ..stream_slots import check_batch_size
from .example import IMAGE_KEY, LABEL_KEY, example_fields
from .files import expand_paths, load_meta
from .framing import (
    HEADER_BYTES,
    OVERHEAD,
    TFRecordError,
    _read,
    _skip,
    check_data,
    check_header,
    parse_record,
)
from .index import count_records, load_index
from .slots import Segment, check_slot, plan_batches, plan_slots, shared_prefixes
from .verified import check_verified


@dataclass(frozen=True)
class StreamRecord:
    """One record as a slot reads it.

    Attributes:
        number: Global record number in file order: a stable sample id (it seeds augmentation).
        where: ``"<path> record at byte <offset>"``, or ``"record <k> of <path>"`` when the
            offset is unknown (after a break in a file read without an index). In GZIP
            files offsets count decompressed bytes.
        image: The encoded image; None when ``error`` is set.
        label: The label (with ``label_offset``); -1 when ``error`` is set.
        error: Why this record could not be read (CRC mismatch, truncation, missing
            feature, changed since it was verified), or None.
        verified: Its data has the CRC32C a converter's strict verification recorded.
    """

    number: int
    where: str
    image: bytes | None
    label: int
    error: Exception | None = None
    verified: bool = False


def _aligned(checksums: np.ndarray | None, n: int) -> np.ndarray:
    """A file's verified checksums for its ``n`` records (fewer when its framing broke:
    the records after the break are never read), NOT_VERIFIED where there are none."""
    out = np.full(n, NOT_VERIFIED, np.int64)
    if checksums is not None:
        m = min(n, len(checksums))
        out[:m] = checksums[:m]
    return out


def open_file(path: str, gz: bool) -> BinaryIO:
    """Opens a record file for sequential reading (decompressing GZIP)."""
    return gzip.open(path, "rb") if gz else open(path, "rb")


class TFRecordStream(PlannedRecords):
    """Records of TFRecord files (GZIP or plain) read in file order, split into equal slots.

    A slot is one reader, ``rank * num_workers + worker`` of ``world_size * num_workers``.
    Across the slots every record is read (decompressed, CRC-checked) once per epoch, and
    every slot yields exactly :meth:`slot_length` records:

    - Plain files are cut into contiguous record ranges (sizes differ by at most one),
      reached by seeking through their indexes.
    - GZIP files go whole to slots, balanced by record count, when there are at least as
      many (non-empty) files as slots. With fewer, they are cut into ranges like plain
      files, and a slot that starts inside a file decompresses (without parsing or
      CRC-checking) the records before its range: a warning suggests more shards.
    - Without ``drop_last`` a short slot repeats its own first records (as
      DistributedSampler pads); with ``drop_last`` long slots stop at the shortest length.
    - On one rank (``records_for(..., batch_size=...)``) nothing is padded: the records, in
      file order, are cut into contiguous runs of whole batches, one per worker (see
      :mod:`fastload.datasets.stream_slots`), so every record comes once. A worker whose
      run starts inside a GZIP file decompresses that file's records before it.

    Record counts come from the indexes of plain files and from one counting pass over
    each GZIP file, cached under ``~/.cache/fastload`` by path, size and mtime.

    A record that cannot be read is yielded with ``error`` set, and reading goes on: after
    a data CRC mismatch or a missing feature, with the next record; after broken framing,
    from the index in plain files, while in GZIP files every record the count says is
    still to come in that file is yielded as an error record.

    Args:
        paths_or_glob: A file, glob, folder of record files, or a list of them.
        transform: Applied to each decoded image.
        image_key, label_key, label_offset, check_crc, index_dir, decoder: As for
            TFRecordDataset (``index_dir`` also holds the GZIP record counts).
        compression: "gzip", None (plain) or "auto" (by the .gz suffix).
        max_pixels: Pixel limit per image (see :class:`~fastload.datasets.base.ImageDataset`).
        verified: As for TFRecordDataset: records with the CRC32C a converter's ``--verify``
            recorded are decoded the cheapest way the crop allows, changed ones are error
            records (:class:`~fastload.verified.ChangedSinceVerifiedError` naming file and
            byte offset). GZIP files are never verified (their sidecar names the plain files).

    Attributes:
        classes: Class names from the metadata sidecar fastload's converter writes, else None.
        verified_by: Who verified the records ("fastload VERSION, strict, DECODER"), or "".
    """

    traits = StreamTraits(whole_batches=True)  # on one rank, records_for(..., batch_size=) splits whole batches

    def __init__(
        self,
        paths_or_glob: Any,
        transform: Any = None,
        *,
        image_key: str = IMAGE_KEY,
        label_key: str = LABEL_KEY,
        label_offset: int = 0,
        check_crc: bool = True,
        compression: str | None = "auto",
        index_dir: str | None = None,
        decoder: str | None = None,
        max_pixels: MaxPixels = MODULE_LIMIT,
        verified: bool = True,
    ) -> None:
        if compression not in ("auto", "gzip", None):
            raise ValueError(f"compression must be 'auto', 'gzip' or None, got {compression!r}")
        if not isinstance(verified, bool):
            raise TypeError(f"verified must be True or False, got {verified!r}")
        files = expand_paths(paths_or_glob)
        gz = [compression == "gzip" or (compression == "auto" and f.endswith(".gz")) for f in files]
        meta = load_meta(files)
        self.classes, expected = meta.classes, meta.counts
        counts, offsets, lengths = [], [], []
        self._broken: dict[int, TFRecordError] = {}
        for i, path in enumerate(tqdm(files, desc="counting TFRecord records", unit="file", delay=2)):
            if gz[i]:
                n, broken = count_records(path, lambda p: open_file(p, True), index_dir)
                off = np.zeros(0, np.int64)
                length = off
            else:
                off, length, broken = load_index(path, index_dir, allow_broken=True)
                n = len(off) + (broken is not None)
            if broken is not None:
                self._broken[i] = broken
                warnings.warn(
                    f"fastload: {broken}; that record and any after it in the file are yielded as error records",
                    RuntimeWarning,
                    stacklevel=2,
                )
            elif expected.get(path, n) != n:
                raise ValueError(
                    f"{path}: {n} records, but the dataset's metadata sidecar says "
                    f"{expected[path]} (file cut short or replaced?)"
                )
            counts.append(n)
            offsets.append(off)
            lengths.append(length)
        self.files = StringArray(files)
        self._gz = SharedArray(gz, np.bool_)
        self._counts = SharedArray(counts, np.int64)
        self._first = SharedArray(np.concatenate([[0], np.cumsum(counts)[:-1]]), np.int64)
        self._index_at = SharedArray(np.concatenate([[0], np.cumsum([len(o) for o in offsets])[:-1]]), np.int64)
        self._offsets = SharedArray(np.concatenate(offsets), np.int64)
        self._lengths = SharedArray(np.concatenate(lengths), np.int64)
        if sum(counts) == 0:
            raise ValueError(f"no records in {files}")
        # By global record number; None when no record is verified.
        self._checksums: SharedArray | None = None
        if verified and meta.verified:
            checks = [_aligned(None if z else meta.verified.get(p), n) for p, z, n in zip(files, gz, counts)]
            self._checksums = SharedArray(np.concatenate(checks), np.int64)
        self.verified_by = meta.verified_by if self._checksums is not None else ""
        self.image_key, self.label_key, self.label_offset = image_key, label_key, label_offset
        self.check_crc = check_crc
        self.transform = as_compose(transform)
        if decoder is not None:
            get_decoder(decoder)  # fail now, naming the backend, not in a worker
        self.decoder = decoder
        self.max_pixels = resolve_max_pixels(max_pixels)
        self._warned = False

    def __len__(self) -> int:
        """All records, one count for every epoch (error records included)."""
        return int(self._counts.array.sum())

    def _plan(self, num_slots: int, batch_size: int | None = None, drop_last: bool = False) -> list[list[Segment]]:
        seekable = (~self._gz.array).tolist()
        counts = self._counts.array.tolist()
        if batch_size is None:
            plan = plan_slots(counts, seekable, num_slots)
        else:
            plan = plan_batches(counts, num_slots, batch_size, drop_last)
        # One rank's runs of whole batches split a GZIP file at each run's end, but with at least as
        # many files as workers that costs a worker at most one file's prefix: worth a warning only
        # where more shards would help.
        few = sum(1 for n in counts if n > 0) < num_slots
        shared = shared_prefixes(plan, seekable) if batch_size is None or few else 0
        if shared and not self._warned:
            self._warned = True
            warnings.warn(
                f"fastload: {shared} GZIP file(s) are split between {num_slots} slots (fewer non-empty "
                "files than ranks × workers): slots decompress the part of a file before theirs. "
                "Write at least as many shards as slots to read every byte once.",
                RuntimeWarning,
                stacklevel=3,
            )
        return plan

    def slot_length(self, num_slots: int, *, drop_last: bool = False) -> int:
        """How many records every one of ``num_slots`` slots yields per epoch.

        Raises:
            ValueError: Some slot would have no records of its own (fewer records than slots).
        """
        check_slot(0, num_slots)
        sizes = [sum(s.stop - s.start for s in segments) for segments in self._plan(num_slots)]
        if min(sizes) == 0:
            raise ValueError(f"{len(self)} records cannot fill {num_slots} slots (ranks × workers); use fewer workers")
        return min(sizes) if drop_last else max(sizes)

    def records_for(
        self, slot: int, num_slots: int, *, drop_last: bool = False, batch_size: int | None = None
    ) -> Iterator[StreamRecord]:
        """The records of ``slot`` (``rank * num_workers + worker`` of ``world_size * num_workers``).

        Yields exactly ``slot_length(num_slots, drop_last=drop_last)`` records in file order;
        a short slot then repeats its own first records as padding. With ``batch_size`` (one
        rank: the slots are its workers) the slot's run of whole batches instead, unpadded.

        Raises:
            TypeError, ValueError: A bad ``slot``, ``num_slots`` or ``batch_size`` (raised here,
                not when iterating).
        """
        check_slot(slot, num_slots)
        if batch_size is not None:
            check_batch_size(batch_size)
            return self._read(self._plan(num_slots, batch_size, drop_last)[slot])
        length = self.slot_length(num_slots, drop_last=drop_last)
        return self._padded(self._plan(num_slots)[slot], length)

    def _padded(self, segments: list[Segment], length: int) -> Iterator[StreamRecord]:
        produced = 0
        while produced < length:
            with contextlib.closing(self._read(segments)) as records:
                for record in records:
                    yield record
                    produced += 1
                    if produced == length:
                        break

    def _read(self, segments: list[Segment]) -> Iterator[StreamRecord]:
        for seg in segments:
            if self._gz.array[seg.file_id]:
                yield from self._read_sequential(seg)
            else:
                yield from self._read_indexed(seg)

    @property
    def verified_count(self) -> int:
        """How many records the converter verified strictly (0 when it did not, or ``verified=False``)."""
        return 0 if self._checksums is None else int((self._checksums.array != NOT_VERIFIED).sum())

    def _expected(self, file_id: int, k: int) -> int:
        """The verified CRC32C of record ``k`` of file ``file_id``, or NOT_VERIFIED."""
        return NOT_VERIFIED if self._checksums is None else int(self._checksums.array[self._first.array[file_id] + k])

    def _record(self, file_id: int, k: int, where: str, data: Any, framed: Any, offset: int) -> StreamRecord:
        """Record ``k`` of file ``file_id`` from its ``data``, read from ``framed`` (ending in
        its CRC), its verified checksum checked (the data CRC was checked unless verified)."""
        number = int(self._first.array[file_id]) + k
        try:
            verified = check_verified(
                data, framed, self._expected(file_id, k), number, where, self.files[file_id], offset
            )
            image, label = example_fields(data, self.image_key, self.label_key, where)
        except (ChangedSinceVerifiedError, TFRecordError, KeyError, ValueError) as e:
            return StreamRecord(number, where, None, -1, e)
        return StreamRecord(number, where, image, label + self.label_offset, None, verified)

    def _error(self, file_id: int, k: int, where: str, error: Exception) -> StreamRecord:
        return StreamRecord(int(self._first.array[file_id]) + k, where, None, -1, error)

    def _read_indexed(self, seg: Segment) -> Iterator[StreamRecord]:
        path = self.files[seg.file_id]
        at = int(self._index_at.array[seg.file_id])
        indexed = int(self._counts.array[seg.file_id]) - (seg.file_id in self._broken)
        with open_file(path, False) as f:
            for k in range(seg.start, seg.stop):
                if k >= indexed:  # the broken record no index reaches past
                    error = self._broken[seg.file_id]
                    yield self._error(seg.file_id, k, f"{path} record at byte {error.offset}", error)
                    continue
                offset, length = int(self._offsets.array[at + k]), int(self._lengths.array[at + k])
                where = f"{path} record at byte {offset}"
                if f.tell() != offset:  # the first record, or a resync after a broken one
                    f.seek(offset)
                buf = f.read(length)
                try:
                    if len(buf) < length:
                        raise TFRecordError(
                            path,
                            offset,
                            f"truncated record at byte {offset}: the index says "
                            f"{length} bytes, the file has {len(buf)}",
                        )
                    # A verified record's CRC is computed by _record's check: not twice.
                    crc = self.check_crc and self._expected(seg.file_id, k) == NOT_VERIFIED
                    data = parse_record(buf, path, offset, crc)
                except TFRecordError as e:
                    yield self._error(seg.file_id, k, where, e)
                    continue
                yield self._record(seg.file_id, k, where, data, buf, offset)

    def _read_sequential(self, seg: Segment) -> Iterator[StreamRecord]:
        path = self.files[seg.file_id]
        count = int(self._counts.array[seg.file_id])
        k, offset = 0, 0
        with open_file(path, bool(self._gz.array[seg.file_id])) as f:
            try:
                while k < seg.stop:
                    head = _read(f, HEADER_BYTES, path, offset)
                    if not head:
                        raise TFRecordError(
                            path,
                            offset,
                            f"the file ends after {k} records at byte {offset}, but it had {count} when counted",
                        )
                    length = check_header(head, path, offset, None)
                    where = f"{path} record at byte {offset}"
                    if k < seg.start:
                        _skip(f, length + 4, path, offset)
                    else:
                        rest = memoryview(_read(f, length + 4, path, offset))
                        if len(rest) < length + 4:  # the stream ended: nothing after can be framed
                            raise TFRecordError(
                                path,
                                offset,
                                f"truncated record at byte {offset}: needs "
                                f"{OVERHEAD + length} bytes, has {HEADER_BYTES + len(rest)}",
                            )
                        try:
                            crc = self.check_crc and self._expected(seg.file_id, k) == NOT_VERIFIED
                            data = check_data(rest, length, path, offset, crc)
                        except TFRecordError as e:
                            yield self._error(seg.file_id, k, where, e)
                        else:
                            yield self._record(seg.file_id, k, where, data, rest, offset)
                    offset += OVERHEAD + length
                    k += 1
            except TFRecordError as e:
                for j in range(max(k, seg.start), seg.stop):
                    where = f"{path} record at byte {offset}" if j == k else f"record {j} of {path}"
                    yield self._error(seg.file_id, j, where, e)

    def record_bytes(self, record: StreamRecord) -> Any:
        """The record's encoded image (read with the record)."""
        return record.image

    def record_verified(self, record: StreamRecord, data: Any) -> bool:
        """Whether ``record``'s data had its verified checksum (checked when it was read)."""
        return record.verified

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        """(image, label) of every record, epoch 0, seed 0, in one process; raises on a bad record."""
        for record in self.records_for(0, 1):
            yield self.decode(record, 0, 0), record.label

    def summary(self) -> dict:
        return {
            "type": type(self).__name__,
            "records": len(self),
            "paths": list(self.files),
            "classes": len(self.classes) if self.classes else None,
        }
