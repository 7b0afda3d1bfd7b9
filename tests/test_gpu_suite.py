"""make gpu-check (benchmarks/gpu_check.py), its steps, summary and carried wheels, without a GPU."""

import argparse
import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_check  # noqa: E402
import gpu_summary  # noqa: E402
import gpu_wheels  # noqa: E402

LEASE_COMMAND_S = 540  # the timeout_s GPU.md gives the device call (of the 600 s a command may run)
ORDER = ["setup", "cuda-tests", "photos", "probe", "correctness", "train", "decode", "h2d"]  # issue 31's priority order


def test_the_step_limits_fit_the_budget_and_the_budget_the_lease():
    limits = sum(s.limit for s in gpu_check.STEPS)
    assert limits < gpu_check.BUDGET_S <= 8 * 60, (limits, gpu_check.BUDGET_S)
    assert gpu_check.BUDGET_S + 60 <= LEASE_COMMAND_S  # room for the interpreter and the files' copy
    assert [s.name for s in gpu_check.STEPS] == ORDER


def test_selected_steps_bring_what_they_need_in_priority_order():
    names = lambda text: [s.name for s in gpu_check.selected(text)]  # noqa: E731
    assert names(None) == names("") == ORDER
    assert names("h2d,train") == ["setup", "photos", "train", "h2d"]
    assert names("decode correctness") == ["setup", "photos", "correctness", "decode"]
    with pytest.raises(ValueError, match="unknown step.*tarin.*the steps: setup, cuda-tests"):
        gpu_check.selected("tarin")
    # Every step that reads the photo set runs after the step that builds it.
    for step in gpu_check.STEPS:
        argv = gpu_check.command(step, "python", argparse.Namespace(dry_run=False, data="d", wheels="w", slack=1.0), "j")
        assert ("--photos" in argv) == ("photos" in step.needs), step


def test_the_cuda_tests_run_in_one_process():
    step = gpu_check.BY_NAME["cuda-tests"]
    argv = gpu_check.command(step, "python", argparse.Namespace(dry_run=False, data="d", wheels="w", slack=1.0), "j")
    assert argv[:3] == ["python", "-m", "pytest"] and argv[argv.index("-p") + 1] == "no:xdist"
    assert argv[argv.index("-o") + 1] == "addopts=" and argv[argv.index("-m", 3) + 1] == "cuda"
    assert "tests/test_prefetch.py" in argv and "tests/test_gpu_decode.py" in argv


def test_a_step_over_its_limit_is_stopped_with_its_children(tmp_path):
    pid_file = tmp_path / "child"
    script = (f"import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)'])\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\nprint('started', flush=True)\n"
              "time.sleep(60)\n")
    out = gpu_check.Output(str(tmp_path / "log"))
    start = time.monotonic()
    rc, last = gpu_check.run([sys.executable, "-c", script], dict(os.environ), 3, out)
    assert rc == gpu_check.TIME_RC and last == "started" and time.monotonic() - start < 30
    child = int(pid_file.read_text())
    time.sleep(0.5)
    try:  # gone, or a zombie not yet reaped by its new parent: either way not running
        with open(f"/proc/{child}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("Z", "X", "gone"), state
    assert "started" in (tmp_path / "log").read_text()


@pytest.fixture
def fake_steps(monkeypatch):
    """Quick steps: setup, one that measures, one that runs on until the budget is spent, one
    left no time."""
    steps = (gpu_check.Step("setup", 20, "ok"), gpu_check.Step("measure", 20, "a figure"),
             gpu_check.Step("stuck", 60, "runs on"), gpu_check.Step("late", 20, "no time left"))
    bodies = {
        "setup": "print('set up')",
        # A measurement written as it is made, then the summary as it stood after setup shown.
        "measure": "import json, sys; open(sys.argv[1], 'a').write(json.dumps({'benchmark': 'bench_h2d', "
                   "'plain_gbps': 50.0, 'stage_gbps': 40.0, 'stage_share': 0.8, 'batch_mb': 38.5}) + '\\n'); "
                   "print(open(sys.argv[2]).read())",
        "stuck": "import time; print('working', flush=True); time.sleep(60)",
        "late": "print('never')",
    }

    def command(step, python, args, jsonl):
        return [python, "-c", bodies[step.name], jsonl, os.path.join(os.path.dirname(jsonl), "summary.txt")]

    monkeypatch.setattr(gpu_check, "STEPS", steps)
    monkeypatch.setattr(gpu_check, "BY_NAME", {s.name: s for s in steps})
    monkeypatch.setattr(gpu_check, "command", command)
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 1)


@pytest.mark.slow  # steps that really wait out their limits: 10 s
def test_a_call_out_of_budget_keeps_every_record_and_its_summary(tmp_path, fake_steps, capsys):
    out = tmp_path / "out"
    rc = gpu_check.main(["--out", str(out), "--budget", "10", "--wheels", str(tmp_path)])
    assert rc == 1
    assert sorted(os.listdir(out)) == sorted(gpu_check.FILES) and len(gpu_check.FILES) <= 4
    records = gpu_summary.load(str(out / "gpu-check.jsonl"))
    assert records[0]["plan"]["steps"] == ["setup", "measure", "stuck", "late"]
    states = {r["step"]: (r["state"], r["last"]) for r in records if "step" in r}
    assert states == {"setup": ("ok", "set up"), "measure": ("ok", states["measure"][1]),
                      "stuck": ("TIME", "working"), "late": ("SKIP", "budget spent")}
    log = (out / "gpu-check.log").read_text()
    assert "  ok   setup" in log.split("=== measure")[1], "the summary is rewritten after each step"
    summary = (out / "summary.txt").read_text()
    assert "TIME stuck" in summary and "SKIP late" in summary and "2 of 4 steps ok" in summary
    assert "H2D (38.5 MB batches): device stage 40.0 GB/s, plain copy_ 50.0 GB/s" in summary
    assert "MISSED H2D >= 85% of a pinned copy_: 80%" in summary
    assert summary in capsys.readouterr().out


def test_a_failed_setup_skips_the_rest(tmp_path, fake_steps, monkeypatch):
    monkeypatch.setattr(gpu_check, "command", lambda step, python, args, jsonl: [python, "-c", "raise SystemExit(3)"])
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), "--steps", "late", "--wheels", str(tmp_path)]) == 1
    states = [(r["step"], r["state"], r["last"]) for r in gpu_summary.load(str(out / "gpu-check.jsonl"))
              if "step" in r]
    assert states == [("setup", "FAIL", ""), ("late", "SKIP", "setup failed")]


def test_summary_reads_the_targets_off_the_figures(tmp_path):
    # Made-up records in the formats the steps write (no measurement).
    run = lambda rate, wait: {"images_per_s": rate, "wait_share": wait, "step_ms": 80.0}  # noqa: E731
    records = [
        {"plan": {"date": "D", "budget": 450, "limits": 430, "steps": ORDER, "dry_run": False}},
        {"benchmark": "setup", "device": "NVIDIA H100 80GB HBM3"},
        {"step": "setup", "state": "ok", "rc": 0, "seconds": 5, "limit": 25, "last": ""},
        {"benchmark": "correctness", "checks": {
            "uint8 equal, process backend, 2 epochs": {"ok": True, "detail": "equal"},
            "uint8 equal, thread backend, 2 epochs": {"ok": False, "detail": "epoch 1: batch 3: 2 of 64 differ"},
            "normalized within 1e-5": {"ok": True, "detail": ""}}},
        {"benchmark": "bench_gpu_train", "results": {"resnet50": {"fastload": run(2900, 0.02)}}},
        {"benchmark": "bench_gpu_train", "results": {"resnet18": {
            "fastload": run(9000, 0.1), "DataLoader best": run(5000, 0.5), "timm create_loader": run(6000, 0.4),
            "model alone": run(12000, 0.0)}}},
        # A model the step stopped within: its runs so far stand in for it, marked.
        {"benchmark": "bench_gpu_train_run", "model": "resnet101", "loader": "fastload", **run(1500, 0.1)},
        {"benchmark": "bench_gpu_train_run", "model": "resnet101", "loader": "fastload", **run(1700, 0.3)},
        {"benchmark": "bench_gpu_train_run", "model": "resnet101", "loader": "DataLoader best", **run(900, 0.5)},
        {"benchmark": "bench_gpu_decode", "decode": {"cpu": {"images_per_s": 8000}, "gpu": {"images_per_s": 20000}},
         "gpu_vs_cpu": 2.5, "batch_size": 256, "workers": 14},
    ]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": "h2d", "sta')  # cut short
    lines = gpu_summary.render(gpu_summary.load(str(jsonl)))
    text = "\n".join(lines)
    assert lines[0] == "gpu-check D on NVIDIA H100 80GB HBM3" and "1 of 8 steps ok" in lines[1]
    assert "MISSED uint8 batches byte-identical to the CPU's" in text and "2 of 64 differ" in text
    assert "met    data wait < 5% of the ResNet-50 step: 2.0%" in text
    assert "MISSED ResNet-18 images/s >= 1.5x the better peer: 1.50x" not in text  # 9000/6000 = 1.5: met
    assert "met    ResNet-18 images/s >= 1.5x the better peer: 1.50x (9000 against timm create_loader 6000)" in text
    assert 'met    decode="gpu" >= 2x the CPU default: 2.50x' in text
    assert "-      H2D >= 85% of a pinned copy_: not measured" in text
    assert "  model alone             12000    0.0%     80.0" in text
    assert "resnet101: images/s, data wait share of the step, step ms (PARTIAL" in text
    assert "  fastload                 1600   20.0%     80.0  2 run(s)" in text
    assert len(lines) <= 40, "one screen"


def test_setup_installs_only_the_wheels_of_packages_the_image_lacks(tmp_path):
    have = tmp_path / "pytest-1.0-py3-none-any.whl"  # a distribution this interpreter has
    lacks = tmp_path / "no_such_dist_xyz-1.0-py3-none-any.whl"
    install, kept = gpu_check.lacking([str(have), str(lacks)])
    assert install == [str(lacks)] and kept == [f"pytest {pytest.__version__}"]


def test_gpu_wheels_carries_nothing_the_image_has(monkeypatch, tmp_path):
    carried = [n.format(cuda="13", suffix="") for n in gpu_wheels.CARRIED]
    assert gpu_wheels.shadowing(carried) == []
    assert gpu_wheels.shadowing(["lmdb", "tqdm", "Protobuf"]) == ["Protobuf", "tqdm"]
    monkeypatch.setattr(gpu_wheels, "CARRIED", {**gpu_wheels.CARRIED, "tqdm": "progress bars"})
    with pytest.raises(SystemExit, match="tqdm: the GPU machine has them"):
        gpu_wheels.main(["--dest", str(tmp_path / "whl")])
    assert not (tmp_path / "whl").exists(), "refused before anything is fetched"


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


def test_runs_are_long_enough_and_never_cross_an_epoch_end():
    import bench_gpu_decode
    import bench_gpu_train

    d = bench_gpu_decode.sizes(bench_gpu_decode.arguments().parse_args([]))
    assert d["workers"] == 14 and d["batch"] == 256
    assert d["timed"] >= 20 * d["workers"] and d["warmup"] >= d["workers"], d  # every worker works, start-up behind
    assert d["epoch"] >= (d["warmup"] + max(d["timed"], d["recipe_timed"]) + 2 * d["workers"]) * d["batch"], d
    t = bench_gpu_train.sizes(bench_gpu_train.arguments().parse_args([]))
    assert t["workers"] == 14 and t["batch"] == 256 and t["models"] == ["resnet50", "resnet18"]
    # A run takes warmup + steps batches; the workers hold up to 2 each ahead of it.
    assert t["epoch"] >= (t["warmup"] + t["steps"] + 2 * t["workers"]) * t["batch"], t


def test_the_dataloader_peer_sends_uint8_and_normalizes_on_the_device(tmp_path):
    import bench_gpu_train
    import gpu_common
    import gpu_photos
    import torch

    from fastload.config import IMAGENET_MEAN, IMAGENET_STD

    gpu_common.import_peers(quick=True)
    root = gpu_photos.build(str(tmp_path / "photos"), 10, workers=1)
    paths, labels = gpu_photos.photo_list(root)
    ds = bench_gpu_train.DecodeJpegDataset(root, paths, labels, 32, gpu_common.pil_decode)
    x, y = ds[3]
    assert x.dtype == torch.uint8 and x.shape == (3, 32, 32) and y == labels[3]
    batch = torch.stack([ds[i][0] for i in range(4)])
    (got, _), = bench_gpu_train.normalized_on(torch.device("cpu"), [(batch, torch.tensor(labels[:4]))])
    want = (batch.double() / 255 - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(
        1, 3, 1, 1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)


def test_photos_come_from_both_wheels_the_same_for_any_number_of_processes(tmp_path):
    import gpu_common
    import gpu_photos

    sources = [os.path.basename(p) for p in gpu_photos.source_paths()]
    assert "grace_hopper.jpg" in sources and "astronaut.png" in sources
    one = gpu_photos.build(str(tmp_path / "one"), 24, workers=1)
    gpu_photos.build(str(tmp_path / "two"), 24, workers=3)
    paths, labels = gpu_photos.photo_list(one)
    assert len(paths) == 24 and sorted(set(labels)) == list(range(10))
    assert all((tmp_path / "one" / p).read_bytes() == (tmp_path / "two" / p).read_bytes() for p in paths)
    with pytest.raises(ValueError, match="built with"):
        gpu_photos.build(one, 30)
    # A step given --photos reads the set the photos step built; it never builds one in its own time.
    args = argparse.Namespace(photos=str(tmp_path / "missing"), quick=False, data=str(tmp_path), images=8192)
    with pytest.raises(FileNotFoundError, match=r"no complete photo set.*\(the photos step\) builds it"):
        gpu_common.photos(args)


# --- the dry run: every line of the call, in a venv of what the GPU machine's image holds ---

# The image's packages that fastload, its tests and the steps use (benchmarks/GPU.md), pinned
# by constraints.txt where it pins them; then, as the tests install them, with --no-deps,
# scikit-image (its photographs), torchvision (its compiled ops stubbed: tests/refs.py) and timm.
IMAGE = ["torch", "numpy", "pillow", "opencv-python-headless", "matplotlib", "pytest", "pytest-xdist", "psutil",
         "tqdm", "protobuf", "pyyaml", "huggingface_hub", "safetensors"]
IMAGE_NO_DEPS = ["scikit-image", "torchvision", "timm"]


def device_venv() -> str:
    """The python of a venv holding what the image holds, made once under .venv (about 1 min idle)."""
    venv = os.path.join(ROOT, ".venv", "gpu-dry-run")
    stamp = os.path.join(venv, ".installed")
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        wanted = json.dumps([IMAGE, IMAGE_NO_DEPS, f.read()])
    if not os.path.exists(stamp) or open(stamp).read() != wanted:
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", "-c",
               os.path.join(ROOT, "constraints.txt")]
        subprocess.run([*pip, *IMAGE], check=True)
        subprocess.run([*pip, "--no-deps", *IMAGE_NO_DEPS], check=True)
        with open(stamp, "w") as f:
            f.write(wanted)
    return os.path.join(venv, "bin", "python")


@pytest.mark.slow
def test_dry_run_of_the_call_in_a_venv_of_the_device_image(tmp_path):
    python, wheels, out = device_venv(), tmp_path / "whl", tmp_path / "out"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_wheels.py"), "--python", version, "--dest",
                    str(wheels)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "STEPS", "OUT")}
    env["TMPDIR"] = str(tmp_path)
    start = time.monotonic()
    # --slack 4: this machine's 2 busy cores are no GPU machine; the limits are the lease's.
    proc = subprocess.run([python, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--dry-run", "--slack", "4",
                           "--out", str(out), "--wheels", str(wheels), "--data", str(tmp_path / "data")],
                          env=env, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - start
    log = (out / "gpu-check.log").read_text()
    records = gpu_summary.load(str(out / "gpu-check.jsonl"))
    steps = {r["step"]: r for r in records if "step" in r}
    failed = {name: r["last"] for name, r in steps.items() if r["state"] != "ok"}
    assert proc.returncode == 0 and not failed, (failed, log[-6000:], proc.stderr[-2000:])
    print(f"dry run: {took:.0f} s; steps: " + ", ".join(f"{n} {r['seconds']:.0f} s" for n, r in steps.items()))
    assert sorted(os.listdir(out)) == sorted(gpu_check.FILES)
    assert list(steps) == ORDER
    plan = records[0]["plan"]
    assert plan["limits"] < plan["budget"] == gpu_check.BUDGET_S and not plan["slack"] > 4
    setup = next(r for r in records if r.get("benchmark") == "setup")
    assert "simplejpeg-1.9.0" in " ".join(setup["installed"]) and setup["image_has"] == [], setup
    # One pytest process: no xdist workers, every CUDA test collected and skipped by name.
    tests = log.split("=== cuda-tests")[1].split("=== photos")[0]
    assert "created:" not in tests and "[gw" not in tests, tests[-2000:]
    assert " SKIPPED" in tests and " PASSED" not in tests and " FAILED" not in tests
    # The peers ran: DataLoader (torchvision v2) and timm in the training feed, timm in the recipe.
    trained = gpu_summary.trained(records)["resnet18"]
    assert set(trained) == {"fastload", "DataLoader best", "timm create_loader", "model alone"}, trained
    assert all(len(r["runs"]) == 2 for r in trained.values())
    benchmarks = {r["benchmark"] for r in records if "benchmark" in r}
    assert {"photos", "gpu_decode_probe", "correctness", "bench_gpu_train", "bench_gpu_decode", "bench_h2d"} <= benchmarks
    probe = [r for r in records if r.get("benchmark") == "gpu_decode_probe" and "config" in r]
    assert probe and not [r for r in probe if r.get("error")], probe
    assert set(gpu_summary.latest(records, "bench_gpu_decode", "recipe")["recipe"]) == {"fastload", "timm"}
    correctness = next(r for r in records if r.get("benchmark") == "correctness")
    assert all(c["ok"] for c in correctness["checks"].values()) and len(correctness["checks"]) == 4
    assert (out / "summary.txt").read_text() in proc.stdout


def test_correctness_compares_bytes_and_names_the_batch():
    import gpu_correct
    import torch

    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    y = torch.arange(4)
    assert gpu_correct.compare([(x, y)] * 2, [(x.clone(), y)] * 2, exact=True) == (True, "2 batches", 0.0)
    odd = x.clone()
    odd[2, 1, 3, 3] ^= 1
    ok, what, worst = gpu_correct.compare([(x, y), (odd, y)], [(x, y), (x, y)], exact=True)
    assert not ok and what == "batch 1: 1 of 4 images differ (by up to 1)" and worst == 1
    assert not gpu_correct.compare([(x, y)], [(x, y), (x, y)], exact=True)[0]
    assert not gpu_correct.compare([(x, y + 1)], [(x, y)], exact=True)[0], "targets too"
    f = x.float() / 255
    assert gpu_correct.compare([(f + 5e-6, y)], [(f, y)], exact=False)[0]
    assert not gpu_correct.compare([(f + 5e-5, y)], [(f, y)], exact=False)[0]
