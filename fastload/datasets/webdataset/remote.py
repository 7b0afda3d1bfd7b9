"""Shards in object storage or on a web server, through fsspec (imported only when a URL is read).

Every network call is retried with exponential backoff on transient failures (timeouts,
dropped connections, server errors); a missing object is not retried. A download that
breaks goes on from the byte it reached (by seeking where the filesystem can, else by
reading past the bytes already received), so the bytes handed on are each handed once.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .index import ShardId

CHUNK = 1 << 20
STREAMING = ("http", "https")  # fsspec's HTTP files stream only with block_size=0 (no Range needed)
_NOT_RETRIED = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_TRANSIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "fsspec", "s3fs", "gcsfs")
T = TypeVar("T")


class DownloadError(OSError):
    """A shard could not be read from the network (after retries).

    Attributes:
        url: The shard.
        offset: The byte the transfer had reached.
        problem: The message without the URL.
    """

    def __init__(self, url: str, offset: int | None = None, problem: str = "") -> None:
        if not problem and offset is None:  # re-raised across processes as type(e)(message)
            super().__init__(url)
            self.url, self.offset, self.problem = "", None, url
            return
        super().__init__(f"{url}: {problem} (at byte {offset})")
        self.url, self.offset, self.problem = url, offset, problem

    def __reduce__(self):
        return type(self), (self.url, self.offset, self.problem)

    def __str__(self) -> str:
        return str(self.args[0])


def is_url(path: str) -> bool:
    """True for ``scheme://...`` other than ``file://``."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def filesystem(url: str, storage_options: dict) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for ``url``.

    Raises:
        ImportError: fsspec, or the filesystem's own package (s3fs, ...), is missing.
    """
    try:
        import fsspec
    except ImportError as e:
        raise ImportError("reading shards from URLs needs fsspec (and s3fs for s3://): "
                          "pip install 'fastload[remote]'") from e
    try:
        return fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as e:
        raise ImportError(f"{url}: {e} (pip install 'fastload[remote]' installs fsspec, s3fs and aiohttp)") from e


def transient(error: BaseException) -> bool:
    """Whether ``error`` may go away on a retry (a missing object will not)."""
    if isinstance(error, _NOT_RETRIED):
        return False
    if isinstance(error, (OSError, TimeoutError, EOFError, ConnectionError)):
        return True
    return type(error).__module__.split(".")[0] in _TRANSIENT_MODULES


@dataclass(frozen=True)
class Remote:
    """How shards are fetched: fsspec storage options and the retry policy.

    Attributes:
        storage_options: Passed to fsspec (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``).
        retries: Further attempts after a transient failure.
        backoff_s: The first wait; each retry waits twice as long (with jitter).
    """

    storage_options: dict = field(default_factory=dict)
    retries: int = 5
    backoff_s: float = 0.2

    def _wait(self, attempt: int) -> None:
        time.sleep(self.backoff_s * (2 ** attempt) * random.uniform(0.5, 1.0))

    def _retried(self, url: str, what: str, call: Callable[[], T]) -> T:
        for attempt in range(self.retries + 1):
            try:
                return call()
            except Exception as e:
                if isinstance(e, FileNotFoundError):
                    raise FileNotFoundError(f"{url}: no such shard (not found by the server, at byte 0)") from e
                if not transient(e) or attempt == self.retries:
                    raise DownloadError(url, 0, f"{what} failed after {attempt + 1} attempt(s): "
                                                f"{type(e).__name__}: {e}") from e
                self._wait(attempt)
        raise AssertionError("unreachable")

    def identify(self, url: str) -> ShardId:
        """The shard's size and version (ETag or Last-Modified), from one metadata request.

        Raises:
            FileNotFoundError: No such object (the message names the URL).
            DownloadError: The server could not be asked, or does not say the size.
        """
        if not is_url(url):
            path = os.path.abspath(local_path(url))
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise FileNotFoundError(f"{url}: no such shard (at byte 0)") from None
            return ShardId(path, st.st_size, str(st.st_mtime_ns))
        fs, path = filesystem(url, self.storage_options)
        info = self._retried(url, "asking for the size", lambda: fs.info(path))
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise DownloadError(url, 0, f"the server does not say the shard's size (got {size!r})")
        version = next((str(info[k]) for k in ("ETag", "etag", "Last-Modified", "LastModified", "mtime")
                        if info.get(k)), "")
        return ShardId(url, size, version)

    def stream(self, shard: ShardId) -> Iterator[bytes]:
        """The shard's bytes in chunks, each byte once; a broken transfer is retried from where it stopped.

        Raises:
            FileNotFoundError: The object is gone.
            DownloadError: The transfer failed ``retries + 1`` times, or the object changed
                size; names the byte reached.
        """
        fs, path = filesystem(shard.url, self.storage_options)
        streaming = fs.protocol in STREAMING or (isinstance(fs.protocol, tuple) and fs.protocol[0] in STREAMING)
        done, failures = 0, 0
        while done < shard.size:
            reached = done
            try:
                with fs.open(path, "rb", block_size=0 if streaming else 8 * CHUNK) as f:
                    if done:
                        try:
                            f.seek(done)
                        except (ValueError, OSError):  # a streaming response says seekable, then refuses
                            _read_past(f, done)
                    while done < shard.size:
                        chunk = f.read(min(CHUNK, shard.size - done))
                        if not chunk:
                            raise EOFError(f"the connection closed after {done} of {shard.size} bytes")
                        if done + len(chunk) > shard.size:
                            raise DownloadError(shard.url, done, f"the object is longer than the {shard.size} "
                                                                 "bytes it had when indexed (replaced?)")
                        done += len(chunk)
                        yield chunk
            except DownloadError:
                raise
            except Exception as e:
                if isinstance(e, FileNotFoundError):
                    raise FileNotFoundError(f"{shard.url}: no such shard (not found by the server, at byte "
                                            f"{done})") from e
                failures = 1 if done > reached else failures + 1  # progress earns a fresh set of retries
                if not transient(e) or failures > self.retries:
                    raise DownloadError(shard.url, done, f"the download broke off after {done} of {shard.size} "
                                                         f"bytes ({failures} failed attempt(s) since the last "
                                                         f"progress): {type(e).__name__}: {e}") from e
                self._wait(failures - 1)

    def read(self, shard: ShardId, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end - 1`` of the shard (one ranged request, retried).

        A server that ignores ranges sends the whole object; the span is cut from it.
        """
        fs, path = filesystem(shard.url, self.storage_options)
        data = self._retried(shard.url, f"reading bytes {start}-{end}", lambda: fs.cat_file(path, start=start, end=end))
        if len(data) != end - start and len(data) == shard.size:
            data = data[start:end]
        if len(data) != end - start:
            raise DownloadError(shard.url, start + len(data), f"asked for bytes {start}-{end}, got {len(data)} bytes "
                                                              "(the object is shorter than when it was indexed?)")
        return data


def _read_past(f: Any, n: int) -> None:
    while n > 0:
        got = f.read(min(CHUNK, n))
        if not got:
            raise EOFError(f"the connection closed {n} bytes before the point to resume from")
        n -= len(got)
