"""Runs every CPU benchmark (``make bench``); --quick runs each in seconds."""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Each entry: a script in this folder and its own arguments (the command line's follow).
BENCHMARKS = ["bench_decode", "bench_pip_only", "bench_loader", "bench_resize", "bench_decode_plan",
              "profile_loader --stages", "bench_collate", "bench_wrap", "bench_formats", "bench_memory", "bench_threads",
              "profile_loader", "bench_h2d", "bench_gpu_train", "bench_spawn_start", "bench_wds", "wds_shuffle",
              "bench_batched_roi", "bench_gpu_decode", "bench_handoff", "bench_augment", "bench_multiview", "bench_recipe",
              "bench_damage", "bench_sample", "bench_handoff_peers", "bench_gpu_rows", "bench_region_decode",
              "bench_checksum", "bench_tune_choice", "bench_ceiling"]


def main(argv: list[str]) -> int:
    failed = []
    for entry in BENCHMARKS:
        name, *own = entry.split()
        print(f"== {entry} {' '.join(argv)}", flush=True)
        if subprocess.call([sys.executable, os.path.join(HERE, f"{name}.py"), *own, *argv]) != 0:
            failed.append(entry)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
