"""A decode-cost calibration made on a busy machine, in a cache folder of its own.

Issue 39 asks that a calibration made beside other jobs must not steer later runs: the
default must stay >= 0.97x every switch, and a pip-only install >= 0.95x a full one,
after one. :func:`busy_calibration` makes that state on purpose: it keeps every CPU busy
with spinning processes while ``fastload.decode.costs.load_or_calibrate(redo=True)``
runs in the given interpreter with ``FASTLOAD_CACHE_DIR`` set to a folder of its own,
then reads back what the calibration recorded of the machine's load. A benchmark then
runs a loader (or a whole install) with ``FASTLOAD_CACHE_DIR`` pointing there.

The cache file is what a later process finds: within ``costs.RETRY_S`` of the
calibration it plans with what :func:`fastload.decode.costs.usable` makes of it; after,
the next process that is not a Loader's worker calibrates again. A benchmark must start
its workers within that time (a worker keeps the planner it started with).

Run alone: ``python benchmarks/busy_calibration.py DIR [--python PY ...]`` prints the
record per interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

#: What the child runs: one calibration, forced, into FASTLOAD_CACHE_DIR; prints the
#: record and the costs a planner would take from it.
_CHILD = """
import json
from fastload.decode import costs
made = costs.load_or_calibrate(redo=True)
print(json.dumps({"load": made.get("load"), "untrusted": bool(made.get("untrusted")),
                  "backend": made.get("backend"), "file": costs.cache_path()}))
"""


def busy_calibration(cache_dir: str, python: str = sys.executable, env: dict | None = None,
                     hogs: int | None = None) -> dict:
    """Calibrates in ``python`` into ``cache_dir`` while ``hogs`` spinning processes (one
    per CPU by default) keep the machine busy; returns what the calibration recorded.

    Args:
        cache_dir: The cache folder (``FASTLOAD_CACHE_DIR``) to calibrate into.
        python: The interpreter whose install is calibrated (each install has its own
            cache file: the key holds its library versions).
        env: Extra environment for the calibrating process (``FASTLOAD_NO_SYSTEM_TURBOJPEG``
            for a pip-only install).
        hogs: Spinning processes; None: one per CPU this process may use.

    Returns:
        ``load`` (``others_cpus``, ``steal``, ``cpus``, ``noisy``), ``untrusted`` (whether
        a planner would ignore the fitted costs), ``backend``, ``file`` and the seconds the
        hogs ran.
    """
    count = hogs if hogs is not None else len(os.sched_getaffinity(0))
    if count < 1:
        raise ValueError(f"hogs must be >= 1, got {count}")
    os.makedirs(cache_dir, exist_ok=True)
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    start = time.perf_counter()
    try:
        time.sleep(0.5)  # the hogs running before the calibration's first tick count
        child_env = {**os.environ, **(env or {}), "FASTLOAD_CACHE_DIR": cache_dir}
        child_env.pop("FASTLOAD_NO_CALIBRATION", None)
        if python != sys.executable:
            child_env.pop("PYTHONPATH", None)  # that install's own fastload, not this checkout's
        out = subprocess.run([python, "-c", _CHILD], env=child_env, capture_output=True, text=True,
                             timeout=600, cwd="/" if python != sys.executable else None)
        if out.returncode:
            raise RuntimeError(f"calibration in {python} failed:\n{out.stderr[-2000:]}")
        record = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in spin:
            p.kill()
        for p in spin:
            p.wait()
    return {**record, "hogs": count, "seconds": round(time.perf_counter() - start, 1), "python": python}


def describe(record: dict) -> str:
    """One line for a benchmark's output."""
    load = record.get("load") or {}
    return (f"calibration on a busy machine ({record['hogs']} spinning processes, {record['seconds']} s) in "
            f"{record['python']}: others kept {load.get('others_cpus')} of {load.get('cpus')} CPUs busy, steal "
            f"{load.get('steal')}, noisy {load.get('noisy')}; planners use "
            f"{'the built-in costs (untrusted)' if record['untrusted'] else 'its fitted costs'}, backend "
            f"{record['backend']}; cache {record['file']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cache_dir")
    p.add_argument("--python", action="append", default=None, help="an interpreter to calibrate (repeatable)")
    args = p.parse_args()
    for python in args.python or [sys.executable]:
        print(describe(busy_calibration(args.cache_dir, python)))


if __name__ == "__main__":
    main()
