"""Shards in object storage or on a web server, through fsspec (imported only when a URL is read).

Every network call is retried with exponential backoff on transient failures (timeouts,
dropped connections, server errors: HTTP 408, 425, 429 and 5xx); a missing object (404,
410) is not retried, nor is a refusal (401, 403). A download that breaks goes on from
the byte it reached: over HTTP with a ``Range: bytes=N-`` request (a server that ignores
it resends the whole object, and the bytes already received are read past), elsewhere by
seeking; the bytes handed on are each handed once. Every HTTP response is checked against
the version (ETag or Last-Modified) the shard was identified with, and a resumed request
carries it as ``If-Range``: an object replaced mid-download is :class:`ShardChanged`, never
two versions spliced into one (the store then downloads the new version from its start).

Every wait is bounded: ``stall_timeout`` is the longest the transport waits for a
connection or for the next bytes of a response (aiohttp's ``sock_connect``/``sock_read``
over HTTP, botocore's ``connect_timeout``/``read_timeout`` for S3), and
``download_timeout``, when set, the most one shard's download may take in all, retries
and backoff included. A download that makes progress between failures gets a fresh set of
retries, but its stalls count over the whole shard: after ``retries + 1`` of them it fails,
so one shard waits at most ``(retries + 1) * stall_timeout`` for a server that keeps
stalling (6 minutes at the defaults; a server that sends half of what is left and then
stalls took 27 stalls, 27 minutes, for a 100 MB shard). Each stall is a warning naming the
URL and the byte it waits for.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..chunks import read_up_to
from .index import ShardId
from .netfaults import describe, is_missing, is_stall, transient

CHUNK = 1 << 20
STREAMING = ("http", "https")  # fsspec's HTTP files stream only with block_size=0
DEFAULT_STALL_TIMEOUT = 60.0
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


class ShardChanged(DownloadError):
    """The object at a shard's URL is not the version it was identified (and indexed) as.

    Attributes:
        version: What the server says it is now.
    """

    def __init__(self, url: str, offset: int | None = None, problem: str = "", version: str = "") -> None:
        super().__init__(url, offset, problem)
        self.version = version

    def __reduce__(self):
        return type(self), (self.url, self.offset, self.problem, self.version)


def _strong(version: str) -> str:
    """``version`` compared weakly: a server may mark the ETag of a GET weak (``W/``) and not the HEAD's."""
    return version[2:] if version.startswith("W/") else version


def response_version(headers: Any) -> str:
    """The version an HTTP response names (ETag, else Last-Modified), as :meth:`Remote.identify`
    reads it from fsspec's info; "" when it names none."""
    return str(headers.get("ETag") or headers.get("Last-Modified") or "")


def is_url(path: str) -> bool:
    """True for ``scheme://...`` other than ``file://``."""
    return "://" in path and not path.startswith("file://")


def local_version(st: os.stat_result) -> str:
    """A local shard's version: its modification time, and its ctime and inode too, which a
    copy that keeps the modification time (cp -p, rsync -t) still changes."""
    return f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def same_local_file(shard: ShardId, st: os.stat_result) -> bool:
    """Whether the local file ``st`` is the content ``shard`` was identified as: its size,
    modification time and inode (not the ctime of :func:`local_version`, which a chmod, a hard
    link or an xattr changes without changing a byte)."""
    mtime, _, inode = shard.version.split(":")
    return (st.st_size, str(st.st_mtime_ns), str(st.st_ino)) == (shard.size, mtime, inode)


def local_path(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _with_timeouts(protocol: str, options: dict, stall_timeout: float | None) -> dict:
    """``options`` with the transport's connect and read timeouts set to ``stall_timeout``
    (those the caller set are kept)."""
    if stall_timeout is None:
        return options
    if protocol in STREAMING:
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        client.setdefault(
            "timeout", aiohttp.ClientTimeout(total=None, sock_connect=stall_timeout, sock_read=stall_timeout)
        )
        return {**options, "client_kwargs": client}
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", stall_timeout)
        config.setdefault("read_timeout", stall_timeout)
        return {**options, "config_kwargs": config}
    return options


def filesystem(url: str, storage_options: dict, stall_timeout: float | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for ``url``; HTTP and S3 wait at most
    ``stall_timeout`` seconds for a connection or for the next bytes.

    Raises:
        ImportError: fsspec, or the filesystem's own package (s3fs, ...), is missing.
    """
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(
            "reading shards from URLs needs fsspec (and s3fs for s3://): pip install 'fastload[remote]'"
        ) from e
    try:
        options = _with_timeouts(url.split("://", 1)[0].lower(), storage_options, stall_timeout)
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        raise ImportError(f"{url}: {e} (pip install 'fastload[remote]' installs fsspec, s3fs and aiohttp)") from e


def _missing(url: str, offset: int) -> FileNotFoundError:
    return FileNotFoundError(f"{url}: no such shard (not found by the server, at byte {offset})")


@dataclass(frozen=True)
class Remote:
    """How shards are fetched: fsspec storage options, timeouts and the retry policy.

    Attributes:
        storage_options: Passed to fsspec (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``).
        retries: Further attempts after a transient failure (a download that made progress
            since its last failure gets a fresh set).
        backoff_s: The first wait; each retry waits twice as long (with jitter).
        stall_timeout: Seconds without a connection or without a byte after which an
            attempt fails (and is retried); None: the transport's own defaults.
        download_timeout: The most seconds one shard's download (or one read of it) may
            take in all, retries included; None: no limit beyond the stall timeout.
    """

    storage_options: dict = field(default_factory=dict)
    retries: int = 5
    backoff_s: float = 0.2
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
    download_timeout: float | None = None

    def filesystem(self, url: str) -> tuple[Any, str]:
        return filesystem(url, self.storage_options, self.stall_timeout)

    def _stall(self) -> str:
        """How long a stall lasted, for messages (``stall_timeout=None``: the transport's own timeout)."""
        return "the transport's own time-out" if self.stall_timeout is None else f"{self.stall_timeout:g} s"

    def _deadline(self) -> float | None:
        return None if self.download_timeout is None else time.monotonic() + self.download_timeout

    def _check(self, url: str, offset: int, deadline: float | None, what: str) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise DownloadError(url, offset, f"{what} took longer than download_timeout={self.download_timeout}s")

    def _wait(self, attempt: int, deadline: float | None = None) -> None:
        pause = self.backoff_s * (2**attempt) * random.uniform(0.5, 1.0)
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)

    def _retried(self, url: str, what: str, call: Callable[[], T], offset: int = 0) -> T:
        deadline = self._deadline()
        for attempt in range(self.retries + 1):
            self._check(url, offset, deadline, what)
            try:
                return call()
            except DownloadError:  # named already (a replaced object): no retry changes it
                raise
            except Exception as e:
                if is_missing(e):
                    raise _missing(url, offset) from e
                if not transient(e) or attempt == self.retries:
                    raise DownloadError(
                        url, offset, f"{what} failed after {attempt + 1} attempt(s): {describe(e)}"
                    ) from e
                self._wait(attempt, deadline)
        raise AssertionError("unreachable")

    def identify(self, url: str) -> ShardId:
        """The shard's size and version (ETag or Last-Modified), from one metadata request.

        The version is "" when the server sends neither; see :class:`.cache.ShardCache` for
        what is then cached.

        Raises:
            FileNotFoundError: No such object (404 or 410; the message names the URL).
            DownloadError: The server could not be asked (after retries on 5xx, 429 and
                network errors), refused (401, 403), or does not say the size.
        """
        if not is_url(url):
            path = os.path.abspath(local_path(url))
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise FileNotFoundError(f"{url}: no such shard (at byte 0)") from None
            return ShardId(path, st.st_size, local_version(st))
        fs, path = self.filesystem(url)
        info = self._retried(url, "asking for the size", lambda: fs.info(path))
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise DownloadError(url, 0, f"the server does not say the shard's size (got {size!r})")
        version = next(
            (str(info[k]) for k in ("ETag", "etag", "Last-Modified", "LastModified", "mtime") if info.get(k)), ""
        )
        return ShardId(url, size, version)

    def _open_at(self, fs: Any, path: str, shard: ShardId, done: int, end: int | None = None) -> Any:
        """The shard opened for reading from byte ``done`` (to ``end``, when given, over HTTP)."""
        protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
        if protocol not in STREAMING:
            f = fs.open(path, "rb", block_size=8 * CHUNK)
            if done:
                try:
                    f.seek(done)
                except (ValueError, OSError):
                    _read_past(f, done)
            return f
        headers = dict(getattr(fs, "kwargs", {}).get("headers") or {})
        if done or end is not None:
            headers["Range"] = f"bytes={done}-{'' if end is None else end - 1}"
            if shard.validated and not shard.version.startswith("W/"):  # If-Range takes strong validators only
                headers["If-Range"] = shard.version  # changed since: the server sends it all, checked below
        f = fs.open(path, "rb", block_size=0, size=shard.size or None, headers=headers)
        response = getattr(f, "r", None)
        now = response_version(response.headers) if response is not None else ""
        if shard.validated and now and _strong(now) != _strong(shard.version):
            f.close()
            raise ShardChanged(
                shard.url,
                done,
                f"the object was replaced: it was version {shard.version!r} when identified, and the server "
                f"now sends {now!r}",
                now,
            )
        if "Range" in headers and response is not None and getattr(response, "status", None) == 206:
            got = str(response.headers.get("Content-Range", ""))
            if not got.startswith(f"bytes {done}-"):
                f.close()
                raise DownloadError(shard.url, done, f"asked for bytes {done}- and the server sent {got!r}")
        elif done:  # the server ignores ranges: it sends the whole object again
            _read_past(f, done)
        return f

    def stream(self, shard: ShardId) -> Iterator[bytes]:
        """The shard's bytes in chunks, each byte once; a broken transfer is retried from where it stopped.

        Raises:
            FileNotFoundError: The object is gone.
            ShardChanged: The server sends another version than ``shard.version`` (HTTP).
            DownloadError: The transfer failed ``retries + 1`` times without progress, stalled
                ``retries + 1`` times in all, took longer than ``download_timeout``, or the
                object changed size; names the byte reached.
        """
        fs, path = self.filesystem(shard.url)
        deadline = self._deadline()
        done, failures, stalls = 0, 0, 0
        while done < shard.size:
            reached = done
            try:
                with self._open_at(fs, path, shard, done) as f:
                    while done < shard.size:
                        self._check(shard.url, done, deadline, f"the download of {shard.size} bytes")
                        chunk = f.read(min(CHUNK, shard.size - done))
                        if not chunk:
                            raise EOFError(f"the connection closed after {done} of {shard.size} bytes")
                        if done + len(chunk) > shard.size:
                            raise DownloadError(
                                shard.url,
                                done,
                                f"the object is longer than the {shard.size} bytes it had when indexed (replaced?)",
                            )
                        done += len(chunk)
                        yield chunk
            except DownloadError:
                raise
            except Exception as e:
                if is_missing(e):
                    raise _missing(shard.url, done) from e
                failures = 1 if done > reached else failures + 1  # progress earns a fresh set of retries
                stalls += is_stall(e)  # ... but stalls count over the whole shard: the wait is bounded
                if not transient(e) or failures > self.retries or stalls > self.retries:
                    why = (
                        f"{stalls} stalls of {self._stall()} without a byte: at most retries + 1 = "
                        f"{self.retries + 1} per shard"
                        if stalls > self.retries
                        else f"{failures} failed attempt(s) since the last progress"
                    )
                    raise DownloadError(
                        shard.url,
                        done,
                        f"the download broke off after {done} of {shard.size} bytes ({why}): {describe(e)}",
                    ) from e
                if is_stall(e):
                    warnings.warn(
                        f"fastload: {shard.url}: the server sent no byte for {self._stall()} at byte {done:,} "
                        f"of {shard.size:,} (stall {stalls} of at most {self.retries + 1} for this shard); asking "
                        f"again from byte {done:,}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                self._wait(failures - 1, deadline)
                self._check(shard.url, done, deadline, f"the download of {shard.size} bytes")

    def read(self, shard: ShardId, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end - 1`` of the shard (one ranged request, retried).

        A server that ignores ranges sends the whole object; the span is cut from it. Over
        HTTP the response must be of the shard's version (:class:`ShardChanged`), as in
        :meth:`stream`: an index applies to the version it was made from.
        """
        fs, path = self.filesystem(shard.url)
        protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol

        def call() -> bytes:
            if protocol not in STREAMING:
                return fs.cat_file(path, start=start, end=end)
            with self._open_at(fs, path, shard, start, end) as f:
                return read_up_to(f, end - start, CHUNK)

        data = self._retried(shard.url, f"reading bytes {start}-{end}", call, start)
        if len(data) != end - start and len(data) == shard.size:
            data = data[start:end]
        if len(data) != end - start:
            raise DownloadError(
                shard.url,
                start + len(data),
                f"asked for bytes {start}-{end}, got {len(data)} bytes "
                "(the object is shorter than when it was indexed?)",
            )
        return data

    def small(self, url: str, limit: int) -> bytes | None:
        """The whole object at ``url`` if it exists and holds at most ``limit`` bytes, else None (retried)."""
        fs, path = self.filesystem(url)
        try:
            info = self._retried(url, "asking for the size", lambda: fs.info(path))
        except FileNotFoundError:
            return None
        if not isinstance(info.get("size"), int) or info["size"] > limit:
            return None
        return self._retried(url, "reading it", lambda: fs.cat_file(path))


def _read_past(f: Any, n: int) -> None:
    while n > 0:
        got = f.read(min(CHUNK, n))
        if not got:
            raise EOFError(f"the connection closed {n} bytes before the point to resume from")
        n -= len(got)
