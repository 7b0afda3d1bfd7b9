"""Where a conversion writes: a hidden, marked folder renamed into place only when complete.

A killed run leaves ``.<dst>.partial-<pid>``, which no dataset glob or folder listing
picks up and every reader refuses (its marker file). The next run into the same
destination removes those of processes that are gone, and refuses while one still runs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import warnings

from ..datasets.partial import MARKER, is_alive, leftovers, marker_info, partial_path


def clean_leftovers(dst: str) -> None:
    """Removes unfinished outputs into ``dst`` left by dead processes.

    Raises:
        FileExistsError: One belongs to a process that still runs (or to another host).
    """
    for path, pid in leftovers(dst):
        info = marker_info(path) or {}
        host = info.get("host") if isinstance(info.get("host"), str) else None
        alive = False if pid == os.getpid() else is_alive(pid, host)
        if alive is False:
            shutil.rmtree(path, ignore_errors=True)
            if pid != os.getpid():
                warnings.warn(f"fastload: removed {path}, an unfinished conversion into {dst} by pid {pid}, "
                              "which is no longer running", RuntimeWarning, stacklevel=3)
            continue
        who = f"pid {pid} is still running" if alive else f"it was started by pid {pid} on host {host}"
        raise FileExistsError(f"{path} is an unfinished conversion into {dst} and {who}; wait for it to end, "
                              "or delete that folder if no conversion is running")


def stage(dst: str, overwrite: bool) -> str:
    """Prepares the temporary folder a conversion into ``dst`` writes to (creating ``dst``'s parents).

    Raises:
        FileExistsError: ``dst`` exists and not ``overwrite``, or another conversion into it runs.
    """
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst} exists; pass --overwrite to replace it")
    clean_leftovers(dst)
    tmp = partial_path(dst, os.getpid())
    os.makedirs(tmp)
    with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "dst": os.path.abspath(dst),
                   "started": time.time()}, f)
    return tmp


def publish(tmp: str, dst: str) -> None:
    """Moves the finished ``tmp`` to ``dst`` (replacing it)."""
    os.remove(os.path.join(tmp, MARKER))
    if os.path.exists(dst):
        shutil.rmtree(dst) if os.path.isdir(dst) else os.remove(dst)
    os.rename(tmp, dst)


def discard(tmp: str) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def close_quietly(*files) -> None:
    """Closes files of an output being abandoned: a close that flushes onto a full disk
    fails again, and must not keep the partial output from being removed."""
    for f in files:
        try:
            f.close()
        except OSError:
            pass
