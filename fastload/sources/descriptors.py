"""Open-file limits: what a Loader's workers need, checked before they start, and said plainly.

At the process's limit (``ulimit -n``), torch's DataLoader fails half-way through starting its
workers with a bare ``OSError: Too many open files`` (and an ``AttributeError`` from the
half-made iterator's ``__del__``); fastload checks first and names the limit and what to do.
"""

from __future__ import annotations

import errno
import os
import resource

# Descriptors DataLoader opens per worker process (its index queue's pipe, the process's
# sentinel and its own pipe end), and for the result queue's pipe.
_PER_WORKER, _PER_LOADER = 4, 2


def dataloader_descriptors(workers: int) -> int:
    """Descriptors a DataLoader with ``workers`` worker processes opens while they run."""
    return _PER_LOADER + _PER_WORKER * workers


def descriptor_limit(error: OSError, doing: str) -> OSError:
    """``error`` (EMFILE, ENFILE) said plainly: which limit, and what to do."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if error.errno == errno.ENFILE:
        limit = "the system's limit on open files (fs.file-max) is reached"
    else:
        limit = f"this process has reached its limit of {soft} open files (ulimit -n, RLIMIT_NOFILE)"
    return OSError(
        error.errno,
        f"fastload: {limit} while {doing}. A Loader with the process backend holds "
        "2 + num_workers × (prefetch_factor + 2) descriptors for its worker buffers (twice as many with "
        'decode="gpu"), and its workers\' '
        "pipes 2 + 4 × num_workers while they run. Raise the limit (ulimit -n 4096 in the shell, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, ...) at the start of the program), close Loaders "
        "you no longer use (loader.close()), or use fewer workers",
    )


def check_descriptors(needed: int, doing: str) -> None:
    """Raises the descriptor-limit error before starting anything when fewer than ``needed``
    descriptors are left (DataLoader's half-made iterator would otherwise fail in its
    ``__del__`` too, and workers it started would be left to stop)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or not os.path.isdir("/proc/self/fd"):
        return
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise descriptor_limit(e, doing) from None
        return
    if used + needed > soft:
        raise descriptor_limit(OSError(errno.EMFILE, os.strerror(errno.EMFILE)), doing)
