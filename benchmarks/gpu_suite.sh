#!/usr/bin/env bash
# The GPU tests and benchmarks, in calls that each fit one device command (< 8 min).
#   bash benchmarks/gpu_suite.sh CALL...      CALL: tests transfer loader train tune suite all
# benchmarks/GPU.md says which device calls to make, in order, and what each carries.
#
# Each CALL writes $OUT/CALL.log (everything printed) and $OUT/CALL.jsonl (one record per
# step: {"step", "rc", "seconds", "last"}, and every benchmark's JSON record), runs every
# step even after one fails, and ends with a one-screen summary. Exit status: 0 when
# every step passed.
#   OUT       where the files go (default: gpu-results)
#   PYTHON    the interpreter (default: python3)
#   WHEELS    carried wheels (default: .whl, made by `make gpu-wheels`): installed into
#             a private folder put on PYTHONPATH; WHEELS/lib (libturbojpeg) goes on
#             LD_LIBRARY_PATH. Wheels for another Python are refused, named.
# Without CUDA the same steps run as a dry run: CUDA tests skip by name, benchmarks run
# their --quick CPU path (tests/test_gpu_suite.py runs this in a fresh venv).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

python_version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
site="${TMPDIR:-/tmp}/fastload-site-$python_version"
setup_note=""
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    made_for=$(sed -n 's/^python //p' "$WHEELS/MANIFEST" 2>/dev/null)
    if [ -n "$made_for" ] && [ "$made_for" != "$python_version" ]; then
        setup_note="carried wheels are for Python $made_for, this is $python_version: not installed (make gpu-wheels GPU_PYTHON=$python_version)"
    elif [ ! -f "$site/.installed" ] || [ "$WHEELS/MANIFEST" -nt "$site/.installed" ]; then
        rm -rf "$site"
        if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
                "$WHEELS"/*.whl; then
            touch "$site/.installed"
            setup_note="carried wheels installed into $site"
        else
            setup_note="installing the carried wheels FAILED (see above)"
        fi
    else
        setup_note="carried wheels already installed in $site"
    fi
    [ -f "$site/.installed" ] && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    # Resolved: WHEELS may be relative to the repository or absolute (the dry run's).
    [ -d "$WHEELS/lib" ] && export LD_LIBRARY_PATH="$(cd "$WHEELS/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    setup_note="no carried wheels in $WHEELS: tests of LMDB/TFRecord skip, PyTurboJPEG rows are left out"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# pyproject.toml's addopts run pytest in two processes (-n 2, pytest-xdist): where xdist is
# missing, that is a usage error (exit 4) before any test, so its addopts are replaced then.
PYTEST_OPTS=()
"$PYTHON" -c 'import xdist' 2>/dev/null || PYTEST_OPTS=(-o "addopts=-m 'not slow'")

if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    QUICK=()
    mode="CUDA"
else
    QUICK=(--quick)
    mode="no CUDA: dry run (CUDA tests skip, benchmarks run --quick on the CPU)"
fi

# step NAME LIMIT_S CMD...: runs CMD under a time limit, output to the log, a record to the jsonl.
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*" | tee -a "$LOG"
    local start=$SECONDS
    timeout --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$LOG" | tee "$OUT/.last" >/dev/null
    local rc=${PIPESTATUS[0]}
    local took=$((SECONDS - start))
    [ "$rc" = 124 ] && echo "=== $name: stopped after its limit of $limit s" | tee -a "$LOG"
    echo "=== $name: exit $rc after $took s" | tee -a "$LOG"
    "$PYTHON" benchmarks/gpu_summary.py --record "$JSONL" "$name" "$rc" "$took" "$OUT/.last"
    rm -f "$OUT/.last"
    [ "$rc" = 0 ] || failed=1
}

header() {
    {
        echo "gpu_suite $CALL on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ): $mode"
        echo "python $python_version ($PYTHON); $setup_note"
        "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no GPU)")'
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
            --format=csv,noheader
        "$PYTHON" -m fastload.cli info 2>&1 | tail -n +2
    } 2>&1 | tee -a "$LOG"
}

photos() {  # the real-photo sets the benchmarks use, built once (cached under data/, git-ignored)
    local n
    for n in "$@"; do
        step "photos-$n" 300 "$PYTHON" -c "import sys; sys.path.insert(0, 'benchmarks')
from common import photo_folder, parser
photo_folder(parser('').parse_args(['--images', '$n', *sys.argv[1:]]))" "${QUICK[@]}"
    done
}

run_call() {
    case $CALL in
    tests)  # every CUDA test, named (skipped by name without a GPU)
        step cuda-tests 420 "$PYTHON" -m pytest "${PYTEST_OPTS[@]}" -m cuda -v -rs -p no:cacheprovider tests/ ;;
    suite)  # the whole default suite, where the device image meets fastload's tests
        step suite 540 "$PYTHON" -m pytest "${PYTEST_OPTS[@]}" -q -rs -p no:cacheprovider tests/ ;;
    transfer)
        step bench_h2d 240 "$PYTHON" benchmarks/bench_h2d.py "${QUICK[@]}" --json "$JSONL"
        step bench_collate 120 "$PYTHON" benchmarks/bench_collate.py "${QUICK[@]}" --json "$JSONL"
        if [ -f benchmarks/bench_gpu_decode.py ]; then
            step bench_gpu_decode 240 "$PYTHON" benchmarks/bench_gpu_decode.py "${QUICK[@]}" --json "$JSONL"
        fi ;;
    loader)
        photos 2000
        step bench_loader 330 "$PYTHON" benchmarks/bench_loader.py "${QUICK[@]}" --json "$JSONL"
        step bench_decode 150 "$PYTHON" benchmarks/bench_decode.py "${QUICK[@]}" --json "$JSONL" ;;
    train)
        photos 10240
        step bench_gpu_train 420 "$PYTHON" benchmarks/bench_gpu_train.py "${QUICK[@]}" --json "$JSONL" ;;
    tune)  # the GPU-memory-aware batch search: the largest ResNet-50 batch that fits
        photos 2000
        if [ ${#QUICK[@]} = 0 ]; then
            step tune-model 240 "$PYTHON" -m fastload.cli tune data/sample/photos2000 --model resnet50 --device cuda \
                --batch-sizes 256 --workers 16 --backends process --seconds 2 --repeats 2 --json "$OUT/.tune.json"
            [ -f "$OUT/.tune.json" ] && "$PYTHON" benchmarks/gpu_summary.py --append "$JSONL" tune "$OUT/.tune.json"
            rm -f "$OUT/.tune.json"
        else
            echo "tune --model resnet50: needs CUDA (its batch search is tested on the CPU in tests/test_tune.py)" \
                | tee -a "$LOG"
        fi ;;
    *)
        echo "gpu_suite: unknown call '$CALL' (tests, suite, transfer, loader, train, tune, all)" >&2
        return 2 ;;
    esac
}

calls=("$@")
[ ${#calls[@]} = 0 ] && calls=(all)
[ "${calls[*]}" = all ] && calls=(tests transfer loader train tune)
status=0
for CALL in "${calls[@]}"; do
    LOG="$OUT/$CALL.log"
    JSONL="$OUT/$CALL.jsonl"
    : >"$LOG"
    : >"$JSONL"
    failed=0
    header
    run_call || failed=1
    "$PYTHON" benchmarks/gpu_summary.py "$JSONL" 2>&1 | tee -a "$LOG"
    [ "$failed" = 0 ] || status=1
done
exit $status
