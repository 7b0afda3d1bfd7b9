"""What this process may use: CPUs (affinity and cgroup quota) and its local rank; what another
process is doing; where a warning points in the program's own code."""

from __future__ import annotations

import math
import os
import sys
from types import FrameType

_PACKAGE = os.path.dirname(os.path.abspath(__file__))  # fastload/


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside fastload."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _cgroup_cpu_limit() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def available_cpus() -> int:
    """CPUs this process may actually run on: affinity mask, capped by the cgroup quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, math.floor(limit)))
    return max(1, n)


def local_world_size() -> int:
    """Processes sharing this machine under torchrun (1 otherwise)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def cpus_per_rank() -> int:
    return max(1, available_cpus() // local_world_size())


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible I/O",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "dead (zombie)",
    "X": "dead",
}


def process_state(pid: int) -> str:
    """What /proc says process ``pid`` is doing ("running", "stopped", ...), or "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            code = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
    return STATES.get(code, code)
