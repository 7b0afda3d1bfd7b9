"""A shard set's indexes, built in a background thread so a remote set does not hold up its
dataset's constructor while every shard downloads.

The shards are identified first (one metadata request each, in the constructor: a
missing shard fails there); indexing them (for remote shards, a download of each, into
the shard cache) then runs in a pool of threads. Whatever needs the samples waits for it
(:meth:`Indexing.wait`, with a progress bar), and an error of any shard is raised there,
where the dataset is first used; its progress bar counts the bytes downloaded (a remote shard is
indexed as it downloads: a count of finished shards sits at 0% for the first shard's whole
download). A process that forks while indexing is under way (a
Loader starting its workers before asking for ``len``) first waits for it, so the
children inherit the finished table instead of waiting for a thread they do not have.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from .index import ShardId, ShardIndex
from .store import ShardStore

BUILDING = threading.RLock()  # one dataset's table is built by one thread
_unfinished: weakref.WeakSet = weakref.WeakSet()  # datasets whose indexes are being made


def _before_fork() -> None:
    for dataset in list(_unfinished):
        try:
            dataset.wait_indexed()
        except Exception:  # stays stored: the child raises it where it uses the dataset
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


def finish_before_fork(dataset: Any) -> None:
    """Makes a fork of this process first wait for ``dataset.wait_indexed()``."""
    _unfinished.add(dataset)


class Indexing:
    """The indexes of ``shards``, made now (``background=False``) or in a background thread.

    Args:
        store: Where shards are read from and indexes stored.
        shards: The identified shards, in the dataset's order.
        threads: Shards indexed at once.
        background: Return at once and index in a thread.
    """

    def __init__(self, store: ShardStore, shards: list[ShardId], threads: int, background: bool) -> None:
        self.shards, self.total, self.done = list(shards), len(shards), 0
        self._got = [0] * len(shards)  # bytes of each shard downloaded (or all of it, once indexed)
        self._store, self._threads = store, threads
        self._indexes: list[ShardIndex] | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="fastload-indexing", daemon=True)
            self._thread.start()
        else:
            self._run()

    def _run(self) -> None:
        try:
            with ThreadPoolExecutor(min(self._threads, self.total)) as pool:
                out = []
                for i, (shard, index) in enumerate(pool.map(self._index, range(self.total))):
                    self.shards[i] = shard  # a shard replaced while it downloaded: its new version
                    out.append(index)
                    self.done += 1
            self._indexes = out
        except BaseException as e:  # raised again by wait(), in the thread that uses the dataset
            self._error = e
        finally:
            self._finished.set()

    def _index(self, i: int) -> tuple[ShardId, ShardIndex]:
        size = self.shards[i].size

        def progress(n: int) -> None:
            self._got[i] = min(size, self._got[i] + n)  # a download started again counts once

        shard, index = self._store.index_current(self.shards[i], progress)
        self._got[i] = size
        return shard, index

    @property
    def bytes(self) -> tuple[int, int]:
        """(bytes downloaded or indexed, bytes of all shards) so far."""
        return sum(self._got), sum(s.size for s in self.shards)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> list[ShardIndex]:
        """The indexes, once all are made (a progress bar shows after 2 s).

        Raises:
            TimeoutError: They are not made within ``timeout`` seconds.
            Exception: What indexing a shard raised (FileNotFoundError, DownloadError, ShardError).
        """
        if not self._finished.is_set():
            got, total = self.bytes
            with tqdm(
                total=total, initial=got, desc="indexing shards", unit="B", unit_scale=True, unit_divisor=1024, delay=2
            ) as bar:
                step = 0.2 if timeout is None else min(0.2, timeout)
                waited = 0.0
                while not self._finished.wait(step):
                    bar.update(self.bytes[0] - bar.n)
                    bar.set_postfix_str(f"{self.done}/{self.total} shards", refresh=False)
                    waited += step
                    if timeout is not None and waited >= timeout:
                        raise TimeoutError(
                            f"indexing {self.total} shard(s) did not finish in {timeout} s ({self.done} done)"
                        )
                bar.update(self.bytes[0] - bar.n)
        if self._error is not None:
            raise self._error
        assert self._indexes is not None
        return self._indexes


def warn_broken(shards: list[ShardId], indexes: list[ShardIndex]) -> None:
    for shard, index in zip(shards, indexes):
        if index.broken_offset >= 0:
            warnings.warn(
                f"fastload: {shard.url}: {index.broken} (at byte {index.broken_offset}); its last "
                "sample is yielded as an error record",
                RuntimeWarning,
                stacklevel=4,
            )
