"""WebDataset: tar shards (local, HTTP(S), S3, anything fsspec reaches) as a shuffled, resumable stream."""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...decode import MODULE_LIMIT, MaxPixels, get_decoder, resolve_max_pixels
from ...transforms import as_compose
from ...verified import NOT_VERIFIED, check_bytes
from ..protocols import StreamTraits
from ..records import PlannedRecords
from ..storage import SharedArray
from ..stream_slots import batch_ranges, check_batch_size
from ..tfrecord.index import cache_folder
from ..tfrecord.slots import check_slot
from .cache import ShardCache
from .indexing import BUILDING, Indexing, finish_before_fork, warn_broken
from .reader import SlotReader
from .remote import DEFAULT_STALL_TIMEOUT, Remote, is_url
from .sidecar import Sidecars, read_sidecars
from .slots import by_shards, first_pass, fit, resumed_pass, slot_sizes
from .store import ShardStore
from .table import MAX_TARGET_BYTES, SampleTable, TargetRule
from .tar import ShardError
from .urls import expand_urls

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff")
TARGET_EXTS = ("cls", "json", "txt")
DEFAULT_CACHE_LIMIT = 16 << 30


@dataclass(frozen=True)
class ShardRecord:
    """One sample as a slot reads it; its bytes are read when it is decoded.

    Attributes:
        number: The sample's position in storage order over all shards (a stable id that
            seeds its augmentation).
        where: ``"<url> sample '<key>' at byte <offset>"``.
        error: Why the sample cannot be read at all (no image member, cut off), or None.
        chunk: The reader's chunk the sample belongs to.
    """

    number: int
    where: str
    error: Exception | None
    chunk: int
    stream: WebDataset = field(repr=False)
    reader: SlotReader = field(repr=False)

    @property
    def label(self) -> int:
        """The sample's target (read from its target member)."""
        return self.stream.target(self)


class WebDataset(PlannedRecords):
    """WebDataset-layout tar shards read as a stream: each sample once per epoch over all ranks
    and workers, with equal batch counts on every rank, shuffled by (seed, epoch), resumable.

    Members ``key.jpg``/``.jpeg``/``.png``/``.webp`` (the first present, see ``image_key``)
    are images; ``key.cls``/``.json``/``.txt`` targets (see :mod:`.table` for how each
    becomes an int). Shards are indexed once per machine (see the README for the cost)
    and, when remote, downloaded whole into a bounded shared cache ahead of use.

    Under ``fastload.Loader`` with ``shuffle=True`` the shard order and the sample order
    within each window of ``window`` shards of a reading slot are drawn from (seed, epoch).
    ``state_dict``/``load_state_dict`` resume mid-epoch on the same or another number of
    ranks and workers.

    Args:
        urls: A path or URL (``https://``, ``s3://``, ...), a brace pattern
            (``shard-{000000..000099}.tar``), a glob (local or object storage), a folder
            of ``.tar`` files, or a list of these.
        transform: Applied to each decoded image.
        decoder: Decoder backend name; None picks the best available.
        max_pixels: Images whose header claims more pixels fail before decoding (None: no
            limit; default ``fastload.decode.MAX_IMAGE_PIXELS``).
        image_key: Image extensions, in order of preference.
        label_key: Target extensions, in order of preference; None: no targets (-1).
        json_key: The field of a ``.json`` target object that holds the label.
        label_offset: Added to every target.
        classes: Class names, so targets may name a class instead of its number (default:
            those of the shard set's sidecar, which fastload's converter writes).
        window: Shards whose samples one slot mixes (also what it holds at once).
        cache: Download remote shards whole into the shard cache (False: read each
            window's byte ranges straight from the network into memory).
        cache_dir: The cache folder (default ``~/.cache/fastload/webdataset``); indexes
            go to its ``index`` folder unless ``index_dir`` says otherwise.
        cache_limit: Most bytes of shards the cache keeps (least recently used evicted).
        storage_options: Passed to fsspec (endpoint, credentials, ...).
        background_index: Index remote shards (a download of each, on first use of the set
            on this machine) in a background thread: the constructor returns once every
            shard is found, and the first use that needs the samples (``len``, a Loader)
            waits for it with a progress bar, raising there what indexing raised. Local
            shards are indexed at once (quickly: header to header).
        retries: Further attempts after a transient network failure (backoff doubles); a
            download that made progress since its last failure gets a fresh set, and goes
            on from the byte it reached.
        stall_timeout: Seconds without a connection or a byte from the server after which
            an attempt fails and is retried (default 60; None: the transport's defaults).
            Stalls count over a whole shard: its download fails after ``retries + 1`` of
            them, so it waits at most ``(retries + 1) * stall_timeout`` on a server that
            keeps stalling (each stall is a warning naming the URL and byte).
        download_timeout: The most seconds one shard's download may take in all, retries
            included (default None: no limit beyond ``stall_timeout``).
        ahead: Chunks (windows) a slot prepares in the background beyond the current one.
        index_threads: Shards identified and indexed at once when the dataset is opened.
        verified: Use the checksums a converter's ``--verify`` recorded in the shard set's
            sidecar (local or remote alike): a sample whose image member still has its
            CRC32C is decoded the cheapest way the crop allows, one whose bytes changed is
            refused (:class:`~fastload.verified.ChangedSinceVerifiedError` naming shard, key
            and byte offset), see :mod:`fastload.verified`. Shards the sidecar has no
            checksums for are decoded strictly. False: every sample decoded strictly.

    Attributes:
        verified_by: Who verified the samples ("fastload VERSION, strict, DECODER"), or "".

    Raises:
        FileNotFoundError: A shard does not exist (the message names it).
        DownloadError: A shard cannot be downloaded for indexing (names URL and byte); a
            read of a shard replaced on the server since it was indexed (ETag or
            Last-Modified changed): a shard replaced while it downloads for indexing is
            downloaded again from its start instead.
        ShardError: A shard is not a tar archive.
        TypeError: ``verified`` is not a bool.
        ValueError: No samples, bad arguments, a malformed sidecar, or a shard whose sample
            count is not the one its checksums were recorded for (replaced since?).
    """

    #: Shuffled by the Loader's shuffle=True (shards and windows), resumed on any number of ranks
    #: and workers, and on one rank split into whole batches (records_for(..., batch_size=)).
    traits = StreamTraits(shuffles=True, elastic=True, whole_batches=True)

    def __init__(
        self,
        urls: Any,
        transform: Any = None,
        *,
        decoder: str | None = None,
        max_pixels: MaxPixels = MODULE_LIMIT,
        image_key: Sequence[str] = IMAGE_EXTS,
        label_key: Sequence[str] | None = TARGET_EXTS,
        json_key: str = "label",
        label_offset: int = 0,
        classes: Sequence[str] | None = None,
        window: int = 4,
        cache: bool = True,
        cache_dir: str | None = None,
        cache_limit: int = DEFAULT_CACHE_LIMIT,
        index_dir: str | None = None,
        storage_options: dict | None = None,
        retries: int = 5,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        download_timeout: float | None = None,
        ahead: int = 1,
        index_threads: int = 8,
        background_index: bool = True,
        verified: bool = True,
    ) -> None:
        if not isinstance(verified, bool):
            raise TypeError(f"verified must be True or False, got {verified!r}")
        for name, value, low in (
            ("window", window, 1),
            ("ahead", ahead, 0),
            ("retries", retries, 0),
            ("index_threads", index_threads, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        for name, seconds in (("stall_timeout", stall_timeout), ("download_timeout", download_timeout)):
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0
            ):
                raise ValueError(f"{name} must be a number of seconds > 0 or None, got {seconds!r}")
        image_exts = (image_key,) if isinstance(image_key, str) else tuple(image_key)
        target_exts = () if label_key is None else (label_key,) if isinstance(label_key, str) else tuple(label_key)
        if not image_exts:
            raise ValueError("image_key names no extension")
        self.urls = expand_urls(urls, storage_options or {})
        root = cache_folder("webdataset", cache_dir)
        self.store = ShardStore(
            Remote(
                dict(storage_options or {}), retries, stall_timeout=stall_timeout, download_timeout=download_timeout
            ),
            ShardCache(root, cache_limit) if cache else None,
            index_dir or os.path.join(root, "index"),
        )
        with ThreadPoolExecutor(min(index_threads, len(self.urls))) as pool:
            shards = list(pool.map(self.store.identify, self.urls))
        big = [s for s in shards if is_url(s.url) and self.store.cache is not None and not self.store.cache.fits(s)]
        if big:
            warnings.warn(
                f"fastload: {len(big)} shard(s) exceed cache_limit={cache_limit} bytes (e.g. {big[0].url}, "
                f"{big[0].size} bytes) and are read straight from the network",
                RuntimeWarning,
                stacklevel=2,
            )
        self._exts = (image_exts, target_exts)
        # Read before indexing starts: _build_table (maybe in a background thread's wake) aligns them.
        sidecars = read_sidecars(self.urls, self.store.remote) if classes is None or verified else Sidecars()
        self._verified_shards = sidecars.verified if verified else {}
        self.verified_by = sidecars.verified_by if self._verified_shards else ""
        self._checksums: SharedArray | None = None
        background = background_index and any(is_url(s.url) for s in shards)
        self._indexing: Indexing | None = Indexing(self.store, shards, index_threads, background)
        if background:
            finish_before_fork(self)
        else:
            self._build_table()
        if classes is None:
            classes = sidecars.classes
        self.rule = TargetRule(target_exts, json_key, label_offset, tuple(classes) if classes is not None else None)
        self.classes = list(classes) if classes is not None else None
        self.transform = as_compose(transform)
        if decoder is not None:
            get_decoder(decoder)  # fail now, naming the backend, not in a worker
        self.decoder, self.max_pixels = decoder, resolve_max_pixels(max_pixels)
        self.window, self.ahead = window, ahead

    def _build_table(self) -> None:
        with BUILDING:  # threads that use the dataset at once build it once
            indexing = self.__dict__.get("_indexing")
            if indexing is None:
                return
            indexes = indexing.wait()
            warn_broken(indexing.shards, indexes)
            table = SampleTable(indexing.shards, indexes, *self._exts)
            if len(table) == 0:
                raise ValueError(f"no samples in {self.urls[:3]}{' ...' if len(self.urls) > 3 else ''}")
            self._checksums = self._aligned(table)
            self.table, self._indexing = table, None

    def _aligned(self, table: SampleTable) -> SharedArray | None:
        """Every sample's verified CRC32C (NOT_VERIFIED where none), by sample number; None when
        no shard has checksums.

        Raises:
            ValueError: A shard holds another number of samples than its checksums (named).
        """
        if not self._verified_shards:
            return None
        parts = []
        for url, count in zip(self.urls, table.counts.array.tolist()):
            crcs = self._verified_shards.get(url)
            if crcs is not None and len(crcs) != count:
                raise ValueError(
                    f"{url}: {count} samples, but the shard set's sidecar has checksums of {len(crcs)} "
                    "(replaced since it was converted?); pass verified=False to decode every sample strictly"
                )
            parts.append(np.full(count, NOT_VERIFIED, np.int64) if crcs is None else crcs)
        self._verified_shards = {}
        return SharedArray(np.concatenate(parts), np.int64)

    def __getattr__(self, name: str) -> Any:
        if name == "table" and self.__dict__.get("_indexing") is not None:  # still being indexed
            self._build_table()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def wait_indexed(self, timeout: float | None = None) -> None:
        """Waits for the shards' indexes (made in the background; see ``background_index``).

        Raises:
            TimeoutError: Not done within ``timeout`` seconds.
            Exception: What indexing raised (FileNotFoundError, DownloadError, ShardError).
        """
        indexing = self.__dict__.get("_indexing")
        if indexing is not None:
            indexing.wait(timeout)
            self._build_table()

    @property
    def indexed(self) -> tuple[int, int]:
        """(shards indexed, shards) so far."""
        indexing = self.__dict__.get("_indexing")
        return (len(self.urls), len(self.urls)) if indexing is None else (indexing.done, indexing.total)

    def __getstate__(self) -> dict:
        self.wait_indexed()  # workers and other processes get the finished table, never a thread
        return dict(self.__dict__)

    def __len__(self) -> int:
        """Samples of all shards (error records included): one epoch's worth."""
        return len(self.table)

    def slot_length(self, num_slots: int, *, drop_last: bool = False) -> int:
        """How many samples every one of ``num_slots`` slots yields in a first pass of an epoch.

        Raises:
            ValueError: Fewer samples than slots.
        """
        check_slot(0, num_slots)
        if len(self) // num_slots == 0:
            raise ValueError(f"{len(self)} samples cannot fill {num_slots} slots (ranks × workers); use fewer workers")
        return slot_sizes(len(self), num_slots, drop_last)

    def resumed_sizes(self, num_slots: int, *, drop_last: bool, order: Any, batch_size: int | None = None) -> list[int]:
        """Samples of each slot in the resumed pass ``order`` (arguments as for :meth:`records_for`)."""
        return [len(numbers) for numbers in self._resumed(num_slots, drop_last, order, batch_size is not None)]

    def _resumed(self, num_slots: int, drop_last: bool, order: Any, one_rank: bool) -> list:
        """Each slot's sample numbers in the resumed pass ``order``."""
        return resumed_pass(
            self.table.counts.array,
            num_slots,
            order.history,
            order.epoch,
            order.seed,
            order.shuffle,
            order.batch_size,
            drop_last,
            self.window,
            one_rank,
        )

    def records_for(
        self, slot: int, num_slots: int, *, drop_last: bool = False, order: Any = None, batch_size: int | None = None
    ) -> Iterator[ShardRecord]:
        """The samples of ``slot`` (``rank * num_workers + worker`` of ``world_size * num_workers``).

        Args:
            slot, num_slots: Which reader this is, of how many.
            drop_last: Cut long slots to the shortest length instead of padding short ones.
            order: The pass (a :class:`fastload.sources.slots.StreamOrder`: epoch, seed,
                shuffle, batch size, and the stages of the epoch run before, if resumed);
                None: the first pass of an unshuffled epoch.
            batch_size: Given on one rank (the slots are its workers): the slot's run of whole
                batches, unpadded (see :mod:`fastload.datasets.stream_slots`).

        Raises:
            TypeError, ValueError: A bad slot, or a history that does not fit this dataset.
        """
        check_slot(slot, num_slots)
        if batch_size is not None:
            check_batch_size(batch_size)
        counts = self.table.counts.array
        if order is not None and order.history:
            slots = self._resumed(num_slots, drop_last, order, batch_size is not None)
            chunks = by_shards(slots[slot], self.table.shard.array, self.window)
        else:
            epoch, seed, shuffle = (order.epoch, order.seed, order.shuffle) if order is not None else (0, 0, False)
            if batch_size is not None:
                bounds = batch_ranges(len(self), num_slots, batch_size, drop_last)[slot]
                chunks = first_pass(counts, slot, num_slots, epoch, seed, shuffle, self.window, bounds)
            else:
                chunks = fit(
                    first_pass(counts, slot, num_slots, epoch, seed, shuffle, self.window),
                    self.slot_length(num_slots, drop_last=drop_last),
                    np.zeros(0, np.int64),
                )
        return self._records(chunks)

    def _records(self, chunks: list[np.ndarray]) -> Iterator[ShardRecord]:
        reader = SlotReader(self.table, self.store, chunks, self.ahead)
        try:
            for k, numbers in enumerate(chunks):
                for number in numbers.tolist():
                    yield ShardRecord(number, self.table.where(number), self.table.error(number), k, self, reader)
        finally:
            reader.close()

    def target(self, record: ShardRecord) -> int:
        """The target of ``record``, read from its target member.

        Raises:
            ShardError: The sample has no target member, or one that is too large.
            ValueError: The target is not a label (see :class:`.table.TargetRule`).
        """
        return self._target(
            record.number, lambda offset, size: record.reader.read(record.chunk, record.number, offset, size)
        )

    def _target(self, n: int, read: Callable[[int, int], bytes]) -> int:
        kind = int(self.table.target_kind.array[n])
        if not self.rule.exts:
            return -1
        url = self.table.shards[int(self.table.shard.array[n])].url
        if kind < 0:
            wanted = "/".join("." + e for e in self.rule.exts)
            raise ShardError(url, None, f"sample {self.table.keys[n]!r} has no target member ({wanted})")
        offset, size = int(self.table.target_offset.array[n]), int(self.table.target_size.array[n])
        if size > MAX_TARGET_BYTES:
            raise ShardError(url, offset, f"a target member of {size} bytes (the limit is {MAX_TARGET_BYTES})")
        try:
            return self.rule.parse(read(offset, size), kind)
        except ValueError as e:
            if isinstance(e, ShardError):
                raise
            raise ShardError(url, offset, f"sample {self.table.keys[n]!r}: {e}") from e

    def read(self, index: int) -> tuple[bytes, int]:
        """Sample ``index``'s encoded image and target, by random access (for converters and checks;
        training reads through :meth:`records_for`).

        Raises:
            IndexError: ``index`` is out of range.
            ShardError, DownloadError, FileNotFoundError: It cannot be read.
        """
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} samples")
        error = self.table.error(index)
        if error is not None:
            raise error
        shard = self.table.shards[int(self.table.shard.array[index])]
        file = self.store.open_local(shard)

        def member(offset: int, size: int) -> bytes:
            if file is None:
                return self.store.span(shard, offset, offset + size)
            data = os.pread(file.fileno(), size, offset)
            if len(data) != size:
                raise ShardError(shard.url, offset + len(data), f"the member at byte {offset} needs {size} bytes")
            return data

        try:
            image = member(int(self.table.image_offset.array[index]), int(self.table.image_size.array[index]))
            return image, self._target(index, member)
        finally:
            if file is not None:
                file.close()

    def describe(self, index: int) -> str:
        """``"<url> sample '<key>' at byte <offset>"``."""
        return self.table.where(index)

    def record_bytes(self, record: ShardRecord) -> bytes:
        """``record``'s encoded image, read from its shard.

        Raises:
            ShardError, DownloadError, FileNotFoundError: Its shard cannot be read.
        """
        n = record.number
        return record.reader.read(
            record.chunk, n, int(self.table.image_offset.array[n]), int(self.table.image_size.array[n])
        )

    def read_checked(self, index: int) -> tuple[bytes, int]:
        """As :meth:`read`, a verified sample's image first checked against its checksum.

        Raises:
            ChangedSinceVerifiedError: The image changed since it was verified (names the sample).
        """
        data, target = self.read(index)
        check_bytes(data, self.verified_checksum(index), index, self.describe(index), "sample")
        return data, target

    def record_verified(self, record: ShardRecord, data: Any) -> bool:
        """Whether ``record``'s image ``data`` has the CRC32C a converter's strict verification
        recorded (False where none was recorded).

        Raises:
            ChangedSinceVerifiedError: It has another ("the sample changed since it was
                verified: <url> sample '<key>' at byte <offset>").
        """
        return check_bytes(data, self.verified_checksum(record.number), record.number, record.where, "sample")

    def verified_checksum(self, number: int) -> int:
        """The CRC32C sample ``number``'s image member had when a converter verified it, or NOT_VERIFIED."""
        self.wait_indexed()  # the table's build aligns the checksums
        checksums = self._checksums
        return NOT_VERIFIED if checksums is None else int(checksums.array[number])

    @property
    def verified_count(self) -> int:
        """How many samples the converter verified strictly (0 when it did not, or ``verified=False``)."""
        self.wait_indexed()
        checksums = self._checksums
        return 0 if checksums is None else int((checksums.array != NOT_VERIFIED).sum())

    def record_name(self, record: ShardRecord) -> str:
        return f"sample {record.number} ({record.where})"

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        """(image, label) of every sample in storage order, epoch 0, seed 0, in one process."""
        for record in self.records_for(0, 1):
            yield self.decode(record, 0, 0), record.label

    def fingerprint(self) -> str:
        """Tells shard sets apart by shard names and sample counts (not by where they are served)."""
        digest = hashlib.sha256()
        for shard, count in zip(self.table.shards, self.table.counts.array.tolist()):
            digest.update(f"{shard.url.rsplit('/', 1)[-1]}:{count}\0".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()[:16]

    def summary(self) -> dict:
        return {
            "type": type(self).__name__,
            "samples": len(self),
            "shards": len(self.urls),
            "classes": len(self.classes) if self.classes else None,
            "cache": self.store.cache is not None,
        }
