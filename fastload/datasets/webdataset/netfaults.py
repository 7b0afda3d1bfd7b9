"""What a network failure means: a missing object, a refusal, or something a retry may fix.

fsspec wraps the transport's errors (its HTTP ``info`` turns a 503 or a refused connection
into ``FileNotFoundError(url)``), so the HTTP status and the transport's own exception are
looked for along the chain of causes.
"""

from __future__ import annotations

RETRIED_STATUS = (408, 425, 429)  # and every 5xx
MISSING_STATUS = (404, 410)
_NOT_RETRIED = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_TRANSIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "fsspec", "s3fs", "gcsfs")


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from (fsspec wraps the transport's)."""
    out: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and len(out) < 8 and all(e is not x for x in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _from_transport(error: BaseException) -> bool:
    return type(error).__module__.split(".")[0] in _TRANSIENT_MODULES


def http_status(error: BaseException) -> int | None:
    """The HTTP status behind ``error`` (aiohttp's or botocore's), or None when there was none."""
    for e in _chain(error):
        status = getattr(e, "status", None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
    return None


def is_missing(error: BaseException) -> bool:
    """Whether ``error`` says the object does not exist (404, 410, or a plain FileNotFoundError;
    fsspec also raises FileNotFoundError for a 503 or a refused connection: those are not)."""
    status = http_status(error)
    if status is not None:
        return status in MISSING_STATUS
    return isinstance(error, FileNotFoundError) and not any(_from_transport(e) for e in _chain(error)[1:])


def transient(error: BaseException) -> bool:
    """Whether ``error`` may go away on a retry (a missing object or a refusal will not)."""
    status = http_status(error)
    if status is not None:
        return status in RETRIED_STATUS or status >= 500
    if is_missing(error):
        return False
    causes = _chain(error)
    if isinstance(error, _NOT_RETRIED) and not any(_from_transport(e) for e in causes[1:]):
        return False
    if isinstance(error, (OSError, TimeoutError, EOFError, ConnectionError)):
        return True
    return any(_from_transport(e) for e in causes)


def is_stall(error: BaseException) -> bool:
    """Whether ``error`` is a wait that ran out (a connect or read timeout: aiohttp's, fsspec's
    and botocore's time-outs are TimeoutErrors or name themselves so)."""
    return any(isinstance(e, TimeoutError) or "Timeout" in type(e).__name__ for e in _chain(error))


def describe(error: BaseException) -> str:
    """``Type: message`` of the transport's own error where fsspec wrapped it (its
    FileNotFoundError(url) says nothing of a 503)."""
    inner = next((e for e in _chain(error) if _from_transport(e) and e is not error), error)
    status = http_status(error)
    text = " ".join(f"{type(inner).__name__}: {inner}".split())  # aiohttp's messages span lines
    return f"HTTP {status} ({text})" if status is not None else text
