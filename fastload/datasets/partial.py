"""Outputs of a conversion still being written (or killed): named and marked so no reader takes them.

A converter writes into a hidden sibling ``.<name>.partial-<pid>`` holding a marker file,
then renames it to ``<name>``. Dataset globs and folder listings skip hidden names, and
readers refuse a folder with the marker, so a killed run leaves nothing that opens.
"""

from __future__ import annotations

import json
import os
import re
import socket

MARKER = ".fastload-partial"


def partial_path(dst: str, pid: int) -> str:
    """The temporary name a conversion into ``dst`` by process ``pid`` writes under."""
    parent, name = os.path.split(os.path.abspath(dst))
    return os.path.join(parent, f".{name}.partial-{pid}")


def marker_info(path: str) -> dict | None:
    """The marker of folder ``path`` ({"pid", "host", "dst"}), or None when it has none."""
    marker = os.path.join(path, MARKER)
    if not os.path.isfile(marker):
        return None
    try:
        with open(marker, encoding="utf-8") as f:
            info = json.load(f)
        if not isinstance(info, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        info = {}  # a marker cut short by the kill still marks the folder
    return info


def is_alive(pid: int, host: str | None) -> bool | None:
    """Whether process ``pid`` on ``host`` runs; None when that cannot be told (another host)."""
    if host is not None and host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(dst: str) -> list[tuple[str, int]]:
    """(path, pid) of every temporary output of a conversion into ``dst``, any pid."""
    parent, name = os.path.split(os.path.abspath(dst))
    pattern = re.compile(rf"^\.?{re.escape(name)}\.partial-(\d+)$")  # also the old unhidden name
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return []
    found = []
    for entry in sorted(entries):
        m = pattern.match(entry)
        if m:
            found.append((os.path.join(parent, entry), int(m.group(1))))
    return found


def check_complete(path: str) -> None:
    """Raises ValueError when ``path`` is the output of an unfinished conversion."""
    info = marker_info(path) if os.path.isdir(path) else None
    if info is None:
        return
    pid, host = info.get("pid"), info.get("host")
    state = ""
    if isinstance(pid, int):
        alive = is_alive(pid, host if isinstance(host, str) else None)
        state = {
            True: f" (pid {pid} is still writing it)",
            False: f" (pid {pid} died before finishing)",
            None: f" (by pid {pid} on {host})",
        }[alive]
    raise ValueError(
        f"{path} is an incomplete conversion{state}: it holds {MARKER}; rerun the converter and open its destination"
    )


def explain_missing(path: str) -> str:
    """A hint for a dataset path that does not exist but has unfinished conversions beside it."""
    found = leftovers(path)
    if not found:
        return ""
    names = ", ".join(os.path.basename(p) for p, _ in found)
    return f"; {names} beside it is an unfinished conversion (rerun the converter)"
