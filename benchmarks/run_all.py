"""Runs every CPU benchmark (``make bench``); --quick runs each in seconds."""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = ["bench_decode", "bench_collate", "bench_loader", "bench_formats", "bench_memory", "bench_threads", "profile_loader", "bench_h2d",
              "bench_gpu_train"]


def main(argv: list[str]) -> int:
    failed = []
    for name in BENCHMARKS:
        print(f"== {name} {' '.join(argv)}", flush=True)
        if subprocess.call([sys.executable, os.path.join(HERE, f"{name}.py"), *argv]) != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
