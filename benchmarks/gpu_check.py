"""make gpu-check: the one device call that proves fastload feeds a GPU (benchmarks/GPU.md).

    python3 benchmarks/gpu_check.py                       # every step, 450 s budget
    STEPS=train,h2d python3 benchmarks/gpu_check.py       # only these (and what they need)
    TRAIN_ARGS="--r50-repeats 0" make gpu-check           # a step's script given more arguments
    python3 benchmarks/gpu_check.py --dry-run             # here, no GPU: every step, small

The steps run in priority order, each a process under its own time limit, all under one
budget for the call: a step gets at most what is left of it, and one that would get
under MIN_STEP_S is skipped. Into $OUT (default gpu-results), three files:
gpu-check.log (everything printed), gpu-check.jsonl (the plan, each measurement as it is
made, each step's record as the step ends) and summary.txt (rewritten after every step):
a call stopped at any point returns what it measured.

The carried wheels (``make gpu-wheels``, WHEELS=.whl) are installed into a private
folder put on PYTHONPATH, those of distributions the interpreter lacks only: nothing
carried shadows the image's own packages.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gpu_summary  # noqa: E402  (no torch: this process imports nothing heavy)

BUDGET_S = 480  # 450 until the probe step (90 s; 40 s since 2026-11-28) came; the lease's command is 540 s
MIN_STEP_S = 10
SMI_TIMEOUT_S = 5  # each nvidia-smi reading; a hung one costs seconds, not the step
CLOCK_FIELDS = "clocks.sm,clocks.mem,temperature.gpu,clocks_throttle_reasons.active"
PHOTOS, QUICK_PHOTOS = 8192, 32  # QUICK_PHOTOS: gpu_common.QUICK_PHOTOS
FILES = ("gpu-check.log", "gpu-check.jsonl", "summary.txt")
TIME_RC = 124  # a step stopped at its limit, as timeout(1) says it
MATRIX_TESTS = "test_gpu_cuda_matrix.py"  # run last in the cuda-tests step


@dataclass(frozen=True)
class Step:
    name: str
    limit: int  # seconds
    what: str
    needs: tuple[str, ...] = ()


# Seconds used on the H200 on 2026-11-27 (results/2026-11-27-gpu): setup 14, cuda-tests 19,
# photos 9, correctness 16, train 97, decode 115, h2d 5; the probe's own hard deadline is
# 85 + 5 s. The train and decode limits are
# the plan of GPU.md ("The plan of the train and decode steps"), their scripts told their
# limit (--time-limit) so that what would not fit is skipped, not cut off.
STEPS = (
    Step("setup", 25, "carried wheels the image lacks installed; versions, GPU, fastload info"),
    Step("cuda-tests", 110, "every test marked cuda, in one process"),
    Step("photos", 15, f"{PHOTOS:,} photos from scikit-image's and matplotlib's photographs, on every core"),
    Step("probe", 40, "nvImageCodec's decode ceiling: backends, regions, threads; nvJPEG 13.3 against 13.0",
         ("photos",)),
    Step("correctness", 30, "device='cuda' batches against the CPU device's; decode='gpu' pixels against the CPU "
         "path's", ("photos",)),
    Step("decode", 100, "decode='gpu' (and with the CPU's share) against the CPU default and torchvision's "
         "decode_jpeg on the GPU, 3 repeats; CPU seconds per image", ("photos",)),
    Step("train", 135, "ResNet-18 (3 repeats) and ResNet-50 (1, 4 workers) fed by fastload, DataLoader + its "
         "prefetcher (workers and prefetch_factor swept), timm; the model alone", ("photos",)),
    Step("h2d", 20, "the Loader's device stage against a copy timed the same way, 14 and 4 workers"),
)
BY_NAME = {s.name: s for s in STEPS}


def selected(names: str | None) -> list[Step]:
    """The steps to run, in priority order: ``names`` (comma or space separated), what they
    need, and setup; every step when ``names`` is empty.

    Raises:
        ValueError: An unknown step name (the message lists the known ones).
    """
    wanted = set(BY_NAME) if not names or not names.replace(",", " ").split() else set(names.replace(",", " ").split())
    unknown = sorted(wanted - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown step(s) {', '.join(unknown)}; the steps: {', '.join(BY_NAME)}")
    wanted |= {"setup"} | {n for w in wanted for n in BY_NAME[w].needs}
    return [s for s in STEPS if s.name in wanted]


def cuda_test_files() -> list[str]:
    """The test files holding tests marked cuda (collecting only these: fast, and no test
    module the image cannot import is collected), the matrix's last: it takes most of the
    step (18 cells), so a step cut short by its limit loses some of its cells, not the other
    files' tests (2026-11-28: the step ran out in the 29th of 40)."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        with open(path, encoding="utf-8") as f:
            if "mark.cuda" in f.read():
                found.append(os.path.relpath(path, ROOT))
    found.sort(key=lambda p: os.path.basename(p) == MATRIX_TESTS)  # stable: the others keep their order
    return found or ["tests"]


def command(step: Step, python: str, args: argparse.Namespace, jsonl: str, granted: float = 0) -> list[str]:
    """The step's argv; ``granted``: the seconds it is given (passed to the benchmarks as
    --time-limit)."""
    quick = ["--quick"] if args.dry_run else []
    photos = os.path.join(args.data, f"gpu-photos-{QUICK_PHOTOS if args.dry_run else PHOTOS}")
    bench = [*quick, "--json", jsonl]
    if step.name == "setup":
        return [python, __file__, "--setup", "--wheels", args.wheels, "--json", jsonl, *(["--dry-run"] * args.dry_run)]
    if step.name == "cuda-tests":  # one process: -p no:xdist, and pyproject's addopts (-n 2) replaced
        # --timeout (pytest-timeout, on the GPU image): a test that hangs (a worker lost in a
        # crash) fails alone and the rest still run.
        hang = ["--timeout", "30"] if importlib.util.find_spec("pytest_timeout") is not None else []
        return [python, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "cuda",
                "-v", "-rs", *hang, *cuda_test_files()]
    if step.name == "photos":
        n, workers = (QUICK_PHOTOS, ["--workers", "2"]) if args.dry_run else (PHOTOS, [])
        return [python, os.path.join(HERE, "gpu_photos.py"), "--root", photos, "--images", str(n), *workers,
                "--json", jsonl]
    if step.name == "probe":  # its deadline inside the step's limit; the 13.0 wheel compared
        budget = f"{(step.limit - 5) * args.slack:.0f}"
        return [python, os.path.join(HERE, "gpu_decode_probe.py"), "--photos", photos, "--json", jsonl,
                "--budget", budget, "--compare-wheels", os.path.join(args.wheels, "nvjpeg130"),
                *(["--dry-run"] * args.dry_run)]
    script = {"correctness": "gpu_correct.py", "train": "bench_gpu_train.py", "decode": "bench_gpu_decode.py",
              "h2d": "bench_h2d.py"}[step.name]
    limit = ["--time-limit", f"{granted:.0f}"] if granted else []
    extra = shlex.split(os.environ.get(f"{step.name.upper()}_ARGS", ""))  # e.g. TRAIN_ARGS="--r50-repeats 0"
    return [python, os.path.join(HERE, script), *bench, *limit, *(["--photos", photos] if "photos" in step.needs
                                                                   else []), *extra]


def gpu_clocks() -> dict:
    """The GPU's SM and memory clocks, temperature and active throttle reasons, read by
    nvidia-smi (bounded by SMI_TIMEOUT_S; read only: nothing here sets a clock). Where the
    driver names the reasons clocks_event_reasons only, that name is asked instead."""
    fields = CLOCK_FIELDS
    for _ in range(2):
        try:
            got = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True,
                                 text=True, timeout=SMI_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"{type(e).__name__}: {e}"[:200]}
        lines = [line.strip() for line in got.stdout.splitlines() if line.strip()]
        if got.returncode == 0 and len(lines) >= 2:
            return {"fields": lines[0], "values": lines[1]}
        if "throttle" not in fields:
            break
        fields = fields.replace("clocks_throttle_reasons", "clocks_event_reasons")
    return {"error": (got.stderr.strip() or got.stdout.strip())[-200:] or f"exit {got.returncode}"}


def clocks_line(reading: dict) -> str:
    return reading.get("values") or f"not read ({reading.get('error', '?')})"


class Output:
    """What the steps print: to this process's stdout and the log, the last line kept."""

    def __init__(self, log_path: str) -> None:
        self.log = open(log_path, "a", encoding="utf-8", errors="replace")
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.log.write(text)
            self.log.flush()


def run(argv: list[str], env: dict, limit: float, out: Output) -> tuple[int, str]:
    """(exit status, last line printed) of ``argv`` stopped after ``limit`` seconds (TIME_RC
    then), its whole process group ended either way (no worker outlives its step)."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace")
    last = [""]

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if line.strip():
                last[0] = line.strip()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = TIME_RC
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(timeout=5)
    return rc, last[0]


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def append(jsonl: str, record: dict) -> None:
    with open(jsonl, "a") as f:
        f.write(json.dumps(record) + "\n")


def check(args: argparse.Namespace) -> int:
    try:
        plan = selected(args.steps)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    paths = [os.path.join(args.out, name) for name in FILES]
    for path in paths:
        open(path, "w").close()
    log, jsonl, summary = paths
    out = Output(log)
    python = sys.executable
    site = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fastload-site-{sys.version_info[0]}.{sys.version_info[1]}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FASTLOAD_SITE": site,
           "PYTHONPATH": os.pathsep.join([site, ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
    limits, budget = sum(s.limit for s in plan), args.budget * args.slack
    append(jsonl, {"plan": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "host": socket.gethostname(), "budget": args.budget, "limits": limits,
                            "slack": args.slack, "steps": [s.name for s in plan], "dry_run": args.dry_run}})
    out.write(f"gpu-check: {', '.join(s.name for s in plan)}; step limits {limits} s, budget {args.budget:.0f} s"
              f"{' (limits over the budget: the last steps get what is left)' if limits > args.budget else ''}"
              f"{f'; every limit and the budget times {args.slack:g}' if args.slack != 1 else ''}"
              f"{'; DRY RUN' if args.dry_run else ''}\n")
    start, failed, ended = time.monotonic(), set(), False
    for step in plan:
        left = budget - (time.monotonic() - start)
        missing = [n for n in step.needs if n in failed]
        if ended or missing or left < MIN_STEP_S:
            why = "setup failed" if ended else f"{', '.join(missing)} failed" if missing else "budget spent"
            record = {"step": step.name, "state": "SKIP", "rc": None, "seconds": 0, "limit": step.limit, "last": why}
            out.write(f"=== {step.name}: skipped ({why})\n")
        else:
            limit = min(step.limit * args.slack, left)
            argv = command(step, python, args, jsonl, limit)
            before = gpu_clocks()
            out.write(f"=== {step.name} (limit {limit:.0f} s): {step.what}\n$ {' '.join(argv)}\n"
                      f"GPU before ({CLOCK_FIELDS}): {clocks_line(before)}\n")
            began = time.monotonic()
            rc, last = run(argv, env, limit, out)
            took = time.monotonic() - began
            after = gpu_clocks()
            state = "ok" if rc == 0 else "TIME" if rc == TIME_RC else "FAIL"
            out.write(f"GPU after: {clocks_line(after)}\n=== {step.name}: {state} (exit {rc}) after {took:.0f} s\n")
            record = {"step": step.name, "state": state, "rc": rc, "seconds": round(took, 1), "limit": step.limit,
                      "last": last[:300], "gpu_before": before, "gpu_after": after}
        if record["state"] != "ok":
            failed.add(step.name)
            ended |= step.name == "setup"
        append(jsonl, record)
        with open(summary, "w") as f:
            f.write("\n".join(gpu_summary.render(gpu_summary.load(jsonl))) + "\n")
    with open(summary) as f:
        out.write(f.read())
    return 1 if failed else 0


def lacking(wheels: list[str]) -> tuple[list[str], list[str]]:
    """(the wheels whose distribution this interpreter lacks, "name version" of those it has):
    only the first are installed, so nothing carried shadows the image's own packages."""
    import importlib.metadata

    install, have = [], []
    for wheel in wheels:
        name = os.path.basename(wheel).split("-")[0]
        try:
            have.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            install.append(wheel)
    return install, have


def setup(args: argparse.Namespace) -> int:
    """The setup step (in its own process): the carried wheels the interpreter lacks installed
    into $FASTLOAD_SITE; versions, the GPU and `fastload info` printed; a setup record."""
    site, problems = os.environ["FASTLOAD_SITE"], []
    wheels = sorted(glob.glob(os.path.join(args.wheels, "*.whl")))
    made_for = ""
    if os.path.exists(os.path.join(args.wheels, "MANIFEST")):
        with open(os.path.join(args.wheels, "MANIFEST")) as f:
            made_for = next((line.split()[1] for line in f if line.startswith("python ")), "")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    shutil.rmtree(site, ignore_errors=True)  # before lacking(): an earlier install is not the image's
    install, have = lacking(wheels)
    if made_for and made_for != here:
        problems.append(f"the carried wheels are for Python {made_for}, this is {here}: "
                        f"make gpu-wheels GPU_PYTHON={here}")
    elif install:
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                              "--no-cache-dir", "--target", site, *install], capture_output=True, text=True)
        if pip.returncode != 0:
            problems.append(f"installing the carried wheels failed: {pip.stderr.strip()[-600:]}")
    print(f"carried wheels in {args.wheels}: {len(wheels)}; installed into {site}: "
          f"{', '.join(os.path.basename(w).split('-')[0] for w in install) or 'none'}; the image's own kept: "
          f"{', '.join(have) or 'none'}")
    import torch

    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "no GPU"
    print(f"python {sys.version.split()[0]} ({sys.executable}); torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"{device}; {os.cpu_count()} CPUs")
    if not cuda and not args.dry_run:
        problems.append("no CUDA GPU here: the steps need one (--dry-run runs them on the CPU)")
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"]
    for argv in ([smi] if cuda else []) + [[sys.executable, "-m", "fastload.cli", "info"]]:
        try:  # each bounded: a hung tool costs seconds of the setup step, not the call
            got = subprocess.run(argv, capture_output=True, text=True, timeout=15, cwd=ROOT)
            print(got.stdout.strip() or got.stderr.strip()[-600:])
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"{' '.join(argv[:3])}: left out ({type(e).__name__}: {e})")
    record = {"benchmark": "setup", "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
              "cpus": os.cpu_count(), "installed": [os.path.basename(w) for w in install], "image_has": have,
              "problems": problems}
    append(args.json, record)
    for p in problems:
        print(f"setup: {p}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default=os.environ.get("STEPS"), help="steps to run (default: $STEPS, else all): "
                   + ", ".join(BY_NAME))
    p.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET", BUDGET_S)),
                   help=f"seconds for the whole call (default: $BUDGET, else {BUDGET_S})")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "gpu-results"),
                   help="where the files go (default: $OUT, else gpu-results)")
    p.add_argument("--wheels", default=os.environ.get("WHEELS", os.path.join(ROOT, ".whl")),
                   help="the carried wheels (default: $WHEELS, else .whl)")
    p.add_argument("--data", default=os.path.join(ROOT, "data"), help="where the photo set is built")
    p.add_argument("--dry-run", action="store_true", default=os.environ.get("DRY_RUN") == "1",
                   help="no GPU: every step on the CPU with small sizes (tests/test_gpu_suite.py)")
    p.add_argument("--slack", type=float, default=1.0,
                   help="every limit and the budget times this (default 1; the dry run on a busy machine)")
    p.add_argument("--setup", action="store_true", help=argparse.SUPPRESS)  # the setup step's own process
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.slack < 1 or args.budget <= 0:
        p.error(f"--slack must be >= 1 and --budget > 0, got {args.slack} and {args.budget}")
    return setup(args) if args.setup else check(args)


if __name__ == "__main__":
    sys.exit(main())
