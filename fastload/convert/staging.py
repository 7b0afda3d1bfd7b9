"""Where a conversion writes: a hidden, marked folder renamed into place only when complete.

A killed run leaves ``.<dst>.partial-<pid>``, which no dataset glob or folder listing
picks up and every reader refuses (its marker file). The next run into the same
destination removes those of processes that are gone, and refuses while one still runs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
import warnings

from ..datasets.partial import MARKER, is_alive, leftovers, marker_info, partial_path

NO_SPACE_EXIT = 3  # the converters' exit status when DST's filesystem fills up (1: --verify, 2: bad input)
_NEARLY_FULL = 1 << 20  # an EIO from a write with less than this free is a full disk


class NoSpaceError(OSError):
    """DST's filesystem filled up during a conversion; the partial output is already removed.

    Attributes:
        dst: The destination asked for.
        needed: About how many more bytes its filesystem needs for the whole output.
    """

    def __init__(self, dst: str, needed: int) -> None:
        self.dst, self.needed = dst, needed
        super().__init__(
            errno.ENOSPC,
            f"no space left on {dst} (needs about {max(1, round(needed / 1e6))} MB "
            "more; the partial output was removed)",
        )

    def __str__(self) -> str:
        return self.strerror or ""


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def no_space(error: BaseException, tmp: str, dst: str, fed_bytes: int, fed: int, total: int) -> NoSpaceError | None:
    """The NoSpaceError ``error`` stands for, after removing ``tmp``; None when it is no full disk.

    ENOSPC and EDQUOT say so directly. LMDB reports a failed page write as a bare
    ``Input/output error`` (its own EIO), so an EIO or ``lmdb.Error`` counts as a full
    disk when ``tmp``'s filesystem has less than 1 MiB free. What is missing is estimated
    from the ``fed_bytes`` of the ``fed`` records handed to the writer so far, scaled to
    all ``total``, less what is free once ``tmp`` is gone. Call with every file in ``tmp``
    closed, or its space is not given back.
    """
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        full = True
    elif code == errno.EIO or type(error).__module__.split(".")[0] == "lmdb":
        try:
            full = _free(tmp) < _NEARLY_FULL
        except OSError:
            return None
    else:
        return None
    if not full:
        return None
    discard(tmp)
    try:
        free = _free(os.path.dirname(os.path.abspath(tmp)))
    except OSError:
        free = 0
    estimate = fed_bytes * total / max(fed, 1)
    return NoSpaceError(dst, max(int(estimate - free), _NEARLY_FULL))


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
                warnings.warn(
                    f"fastload: removed {path}, an unfinished conversion into {dst} by pid {pid}, "
                    "which is no longer running",
                    RuntimeWarning,
                    stacklevel=3,
                )
            continue
        who = f"pid {pid} is still running" if alive else f"it was started by pid {pid} on host {host}"
        raise FileExistsError(
            f"{path} is an unfinished conversion into {dst} and {who}; wait for it to end, "
            "or delete that folder if no conversion is running"
        )


#: Files a folder of a converter's output may hold besides what its sidecar lists: LMDB's
#: files, ``fastload verify``'s manifest, and what a file manager leaves.
_ALWAYS_OURS = ("data.mdb", "lock.mdb", "fastload-verified.json", ".DS_Store", "Thumbs.db")
_SIDECAR = ".fastload.json"
_SIDECAR_MAX = 64 << 20  # a sidecar larger than this is not one of ours


def _listed(folder: str, name: str) -> set[str]:
    """The files sidecar ``name`` in ``folder`` says a conversion wrote: itself, its shards and
    their indexes; none where it is not a converter's sidecar."""
    path = os.path.join(folder, name)
    try:
        if os.path.getsize(path) > _SIDECAR_MAX:
            return set()
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return set()
    shards = (doc.get("records") or doc.get("samples")) if isinstance(doc, dict) else None
    if not isinstance(shards, dict) or not all(isinstance(k, str) and os.sep not in k for k in shards):
        return set()
    return {name, *shards, *(k + ext for k in shards for ext in (".idx", ".index"))}


def _not_written_here(dst: str) -> list[str]:
    """What in an existing ``dst`` no conversion wrote: anything but an LMDB's files, and the
    sidecar of TFRecord or WebDataset shards with the shards (and indexes) it lists; a file or
    link given as ``dst`` itself."""
    if not os.path.isdir(dst) or os.path.islink(dst):
        return [os.path.basename(os.path.normpath(dst))]
    names = os.listdir(dst)
    ours = set(_ALWAYS_OURS)
    for name in names:
        if name.endswith(_SIDECAR):
            ours |= _listed(dst, name)
    return sorted(
        name + ("/" if os.path.isdir(os.path.join(dst, name)) else "")
        for name in names
        if not (os.path.isfile(os.path.join(dst, name)) and (name in ours or name.startswith(".fastload")))
    )


def check_apart(src: str, dst: str) -> None:
    """Refuses a destination that is the source, inside it or around it (``--overwrite`` would
    delete the source; an output inside a folder would join its images).

    Raises:
        ValueError: They overlap (the message names both).
    """
    s, d = os.path.realpath(src), os.path.realpath(dst)
    inside = os.path.isdir(s) and d.startswith(s.rstrip(os.sep) + os.sep)
    around = s.startswith(d.rstrip(os.sep) + os.sep)
    if s == d or inside or around:
        where = "is" if s == d else "is inside" if inside else "holds"
        raise ValueError(f"the destination {dst} {where} the source {src}: write the output elsewhere")


def check_destination(dst: str, overwrite: bool) -> None:
    """Refuses an existing ``dst`` unless ``overwrite``, and then unless it holds only a
    converter's output (checked as a conversion starts, and again before it replaces ``dst``:
    one made meanwhile is not deleted).

    Raises:
        FileExistsError: It is refused (the message names some of what it holds).
    """
    if not os.path.lexists(dst):
        return
    if not overwrite:
        raise FileExistsError(f"{dst} exists; pass --overwrite to replace it")
    others = _not_written_here(dst)
    if others:
        shown = ", ".join(repr(name) for name in others[:5]) + (
            f" and {len(others) - 5} more" if len(others) > 5 else ""
        )
        raise FileExistsError(
            f"{dst} holds what no conversion writes ({shown}): --overwrite replaces only a converter's "
            "output; write elsewhere, or move or delete it yourself"
        )


def stage(dst: str, overwrite: bool) -> str:
    """Prepares the temporary folder a conversion into ``dst`` writes to (creating ``dst``'s parents).

    With ``overwrite``, an existing ``dst`` is replaced only once the new output is complete,
    and only where it holds nothing but what a conversion writes: never a folder of anything
    else (photos, a subfolder, other files) nor a file.

    Raises:
        FileExistsError: ``dst`` exists and not ``overwrite``, or another conversion into it runs,
            or it holds what no conversion wrote (the message names some of it).
    """
    check_destination(dst, overwrite)
    clean_leftovers(dst)
    tmp = partial_path(dst, os.getpid())
    try:
        os.makedirs(tmp)
        with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as f:
            json.dump(
                {"pid": os.getpid(), "host": socket.gethostname(), "dst": os.path.abspath(dst), "started": time.time()},
                f,
            )
    except OSError as e:
        full = no_space(e, tmp, dst, 0, 0, 0)
        discard(tmp)
        if full is not None:
            raise full from e
        raise
    return tmp


def publish(tmp: str, dst: str, overwrite: bool) -> None:
    """Moves the finished ``tmp`` to ``dst`` (replacing it, as :func:`check_destination` allows).

    Raises:
        FileExistsError: ``dst`` was made during the conversion and is refused.
    """
    check_destination(dst, overwrite)
    os.remove(os.path.join(tmp, MARKER))
    if os.path.exists(dst):
        shutil.rmtree(dst) if os.path.isdir(dst) else os.remove(dst)
    os.rename(tmp, dst)


def discard(tmp: str) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def close_quietly(*files: object) -> None:
    """Closes each of ``files`` (None skipped), ignoring the error a full disk gives the flush on close."""
    for f in files:
        if f is not None:
            try:
                f.close()  # type: ignore[attr-defined]
            except OSError:
                pass
