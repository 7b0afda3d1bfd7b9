"""benchmarks/gpu_suite.sh, the carried wheels and the call summaries, checked without a GPU."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_summary  # noqa: E402
import gpu_wheels  # noqa: E402

# What the GPU machine's image holds of what fastload and its tests use (benchmarks/GPU.md);
# everything else must come from the carried wheels.
DEVICE_IMAGE = ["torch==2.13.0", "numpy", "pillow", "opencv-python-headless", "pytest"]
CALLS = ("tests", "transfer", "loader", "train", "tune")


def test_summary_names_every_step_and_headline(tmp_path):
    # Made-up records in the formats the steps and benchmarks write (no measurement).
    jsonl = tmp_path / "train.jsonl"
    records = [
        {"step": "cuda-tests", "rc": 0, "seconds": 40, "last": "12 passed in 30s"},
        {"step": "bench_h2d", "rc": 1, "seconds": 3, "last": "RuntimeError: boom"},
        {"step": "bench_loader", "rc": 124, "seconds": 330, "last": ""},
        {"benchmark": "bench_gpu_train", "quick": False, "results": {"resnet50": {
            "fastload process": {"images_per_s": 2900.0, "wait_share": 0.01},
            "DataLoader + torchvision": {"images_per_s": 1500.0, "wait_share": 0.4}}}},
        {"benchmark": "tune", "best": {"batch_size": 256, "num_workers": 16, "backend": "process"},
         "best_samples_per_s": 3000.0, "model": {"name": "resnet50", "max_batch_size": 640, "samples_per_s": 2800.0,
                                                "batch_size": 256}},
        {"benchmark": "bench_new", "quick": True, "rate": 12.5, "name": "x"},
    ]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = gpu_summary.summary(str(jsonl))
    text = "\n".join(lines)
    assert lines[0].startswith("== summary: 3 steps, 2 failed")
    assert "  FAIL bench_h2d" in text and "  ok   cuda-tests" in text and "  TIME bench_loader" in text
    assert "resnet50: fastload process 2900/s (wait 1.0%); DataLoader + torchvision 1500/s (wait 40.0%)" in text
    assert "model resnet50: largest batch that fits 640" in text and "bench_new (quick): rate 12.5" in text
    assert len(lines) <= 30, "one screen"


def test_a_step_record_keeps_the_last_line(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("first\nlast words\n\n")
    jsonl = tmp_path / "c.jsonl"
    gpu_summary.main(["--record", str(jsonl), "cuda-tests", "1", "12", str(out)])
    gpu_summary.main(["--record", str(jsonl), "bench_h2d", "0", "3", str(tmp_path / "missing")])
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert records == [{"step": "cuda-tests", "rc": 1, "seconds": 12, "last": "last words"},
                       {"step": "bench_h2d", "rc": 0, "seconds": 3, "last": ""}]


def test_wheel_requirements_and_pins_are_read(tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nRequires-Dist: numpy>=1.19\nRequires-Dist: "
                   "Crc32C; python_version >= '3'\nRequires-Dist: colorama; platform_system == \"Windows\"\n"
                   "Requires-Dist: pytest; extra == \"dev\"\n")
    assert gpu_wheels.requires(str(wheel)) == ["numpy", "crc32c"]
    pinned = gpu_wheels.pins(os.path.join(ROOT, "constraints.txt"))
    for name in gpu_wheels.CARRIED:
        assert gpu_wheels.canonical(name.format(cuda="13", suffix="")) in pinned, name


def failed_calls(out, calls=CALLS) -> str:
    """The output of every call of gpu_suite.sh with a failed step (their logs' ends), else
    what each call's summary said: the assertion names the call that failed, not the last one."""
    shown, summaries = [], []
    for call in calls:
        log, jsonl = out / f"{call}.log", out / f"{call}.jsonl"
        text = log.read_text() if log.exists() else f"(no {log.name})"
        steps = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
        failed = [r["step"] for r in steps if r.get("rc", 0) != 0]
        if failed:
            shown.append(f"--- call {call!r}: failed step(s) {', '.join(failed)}; the end of {log}:\n{text[-3000:]}")
        summaries += [line for line in text.splitlines() if line.startswith("== summary")] or [f"{call}: no summary"]
    return "\n".join(shown) if shown else "no step failed; the calls' summaries:\n" + "\n".join(summaries)


def test_failed_calls_show_the_output_of_the_failing_call(tmp_path):
    for call in CALLS:
        (tmp_path / f"{call}.log").write_text(f"{call} start\n== summary: 1 steps, 0 failed\n")
        (tmp_path / f"{call}.jsonl").write_text(json.dumps({"step": call, "rc": 0, "seconds": 1, "last": ""}) + "\n")
    assert failed_calls(tmp_path).startswith("no step failed")
    (tmp_path / "tests.log").write_text("pytest: error: unrecognized arguments: -n\n" + "x\n" * 5000)
    (tmp_path / "tests.jsonl").write_text(json.dumps({"step": "cuda-tests", "rc": 4, "seconds": 2, "last": "x"}) + "\n")
    message = failed_calls(tmp_path)
    assert "call 'tests': failed step(s) cuda-tests" in message and "transfer" not in message


@pytest.mark.slow  # a venv-less pytest run of the suite's steps, about 14 s: make test-slow
def test_pytest_steps_run_without_xdist(tmp_path):
    """The device image may lack pytest-xdist, whose -n 2 pyproject's addopts name: the suite's
    pytest steps must still run their tests (here xdist is hidden from this Python and pytest)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['xdist'] = None  # import xdist fails\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable, WHEELS=str(tmp_path / "none"),
               PYTHONPATH=str(hide), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_suite.sh"), "tests"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, failed_calls(tmp_path / "out", ("tests",)) + proc.stderr[-2000:]
    log = (tmp_path / "out" / "tests.log").read_text()
    assert "unrecognized arguments" not in log and " SKIPPED" in log


@pytest.mark.parametrize("relative", [False, True])
def test_the_carried_library_folder_is_on_the_library_path(tmp_path, relative):
    """WHEELS/lib (the carried libturbojpeg) reaches the suite's Python, whether WHEELS is
    absolute (the dry run's) or relative to the repository (`make gpu-wheels`' .whl)."""
    wheels = tmp_path / "whl"
    (wheels / "lib").mkdir(parents=True)
    (wheels / "not-a-wheel-1.0-py3-none-any.whl").write_text("")  # the carried-wheels branch runs; its install fails
    seen = tmp_path / "seen"
    (tmp_path / "python").write_text(f'#!/bin/sh\necho "$LD_LIBRARY_PATH" >> {seen}\nexec {sys.executable} "$@"\n')
    (tmp_path / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")}
    env.update(OUT=str(tmp_path / "out"), PYTHON=str(tmp_path / "python"), TMPDIR=str(tmp_path),
               WHEELS=os.path.relpath(wheels, ROOT) if relative else str(wheels))
    subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_suite.sh"), "no-such-call"], env=env,
                   capture_output=True, text=True, timeout=300)
    paths = {os.path.realpath(p) for line in seen.read_text().splitlines()[1:] for p in line.split(":") if p}
    assert os.path.realpath(wheels / "lib") in paths, paths


@pytest.mark.slow
def test_dry_run_in_a_venv_of_the_device_image_with_carried_wheels(tmp_path):
    """The device calls, end to end, on this machine: a fresh venv with only what the GPU
    machine's image holds, wheels fetched for this Python the way `make gpu-wheels` fetches
    them for the device's, and every call of gpu_suite.sh."""
    venv, wheels, out = tmp_path / "venv", tmp_path / "whl", tmp_path / "out"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    constraints = os.path.join(ROOT, "constraints.txt")
    subprocess.run([python, "-m", "pip", "install", "-q", "-c", constraints, *DEVICE_IMAGE], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-c", constraints, "scikit-image"], check=True)
    version = "%d.%d" % sys.version_info[:2]
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_wheels.py"), "--python", version, "--dest",
                    str(wheels)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OUT=str(out), PYTHON=python, WHEELS=str(wheels), TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_suite.sh"), *CALLS], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, failed_calls(out) + proc.stderr[-2000:]
    assert sorted(os.listdir(out)) == sorted(f"{c}.{ext}" for c in CALLS for ext in ("jsonl", "log"))
    log = (out / "tests.log").read_text()
    assert "carried wheels installed" in log and "no CUDA: dry run" in log
    skipped = [line for line in log.splitlines() if "::test_" in line and " SKIPPED" in line]
    assert len(skipped) >= 5 and not [line for line in log.splitlines() if " PASSED" in line or " FAILED" in line]
    records = {c: [json.loads(line) for line in (out / f"{c}.jsonl").read_text().splitlines()] for c in CALLS}
    assert all(r["rc"] == 0 for rs in records.values() for r in rs if "step" in r), records
    benchmarks = {r["benchmark"] for rs in records.values() for r in rs if "benchmark" in r}
    expected = {"bench_h2d", "bench_collate", "bench_loader", "bench_decode", "bench_gpu_train"}
    if os.path.exists(os.path.join(ROOT, "benchmarks", "bench_gpu_decode.py")):  # gpu_suite.sh runs it when present
        expected.add("bench_gpu_decode")
    assert benchmarks == expected, benchmarks
    assert all(r["quick"] for rs in records.values() for r in rs if "benchmark" in r)
    assert "PyTurboJPEG unavailable" not in (out / "loader.log").read_text(), "the carried PyTurboJPEG is used"
