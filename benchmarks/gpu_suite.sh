#!/usr/bin/env bash
# GPU tests and GPU benchmarks in one call; everything lands under $OUT.
#   device tool:  bash benchmarks/gpu_suite.sh          (with .whl carried, see below)
#   elsewhere:    OUT=gpu-results bash benchmarks/gpu_suite.sh
# Packages the device image lacks (lmdb, PyTurboJPEG, tfrecord, crc32c) travel as wheels
# in .whl/ (git-ignored); fastload imports them lazily, so the suite runs without them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fastload-site .whl/*.whl
    export PYTHONPATH=/tmp/fastload-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
status=0
{ nvidia-smi; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/device.txt" 2>&1
python3 -m pytest -q -m cuda -p no:cacheprovider tests/ 2>&1 | tee "$OUT/cuda_tests.txt" || status=1
for bench in bench_h2d bench_gpu_train bench_loader bench_decode bench_collate; do
    python3 "benchmarks/$bench.py" --json "$OUT/results.jsonl" 2>&1 | tee "$OUT/$bench.txt" || status=1
done
exit $status
