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
ORDER = ["setup", "cuda-tests", "photos", "probe", "correctness", "decode", "train", "h2d"]  # issue 38's priority order


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
                   "'plain_gbps': 50.0, 'stage_gbps': 40.0, 'stage_share': 0.8, 'batch_mb': 38.5, 'by_workers': "
                   "[{'workers': 14, 'plain_gbps': 50.0, 'stage_gbps': 40.0, 'share_per_repeat': [0.8, 0.84]}]}) "
                   "+ '\\n'); print(open(sys.argv[2]).read())",
        "stuck": "import time; print('working', flush=True); time.sleep(60)",
        "late": "print('never')",
    }

    def command(step, python, args, jsonl, granted=0):
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
    assert "H2D (38.5 MB batches, 14 workers): device stage 40.0 GB/s, plain copy 50.0 GB/s" in summary
    assert ("MISSED H2D stage >= 85% of the plain copy timed the same way, 14 workers: median 82% (per repeat 80% "
            "to 84%, 2 repeats)") in summary
    assert summary in capsys.readouterr().out


def test_a_failed_setup_skips_the_rest(tmp_path, fake_steps, monkeypatch):
    monkeypatch.setattr(gpu_check, "command",
                        lambda step, python, args, jsonl, granted=0: [python, "-c", "raise SystemExit(3)"])
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), "--steps", "late", "--wheels", str(tmp_path)]) == 1
    states = [(r["step"], r["state"], r["last"]) for r in gpu_summary.load(str(out / "gpu-check.jsonl"))
              if "step" in r]
    assert states == [("setup", "FAIL", ""), ("late", "SKIP", "setup failed")]


def test_summary_reads_the_targets_off_the_figures(tmp_path):
    # Made-up records in the formats the steps write (no measurement).
    def runs(model, label, rates, wait=0.0, workers=14):
        return [{"benchmark": "bench_gpu_train_run", "model": model, "loader": label, "repeat": r, "images_per_s": v,
                 "wait_share": wait, "step_ms": 20.0, "workers": workers, "steps": 100} for r, v in enumerate(rates)]

    def feed(rows):
        return {"runs": rows}

    r18 = {"fastload": runs("resnet18", "fastload", [9000, 9300, 8800], 0.3),
           "fastload gpu+cpu": runs("resnet18", "fastload gpu+cpu", [12700, 12800, 12600], 0.01),
           "DataLoader best": runs("resnet18", "DataLoader best", [6000, 8600, 6100], 0.5),
           "timm create_loader": runs("resnet18", "timm create_loader", [5000, 5100, 5200], 0.6),
           "model alone": runs("resnet18", "model alone", [13300, 13200, 13250], 0.0, 0)}
    decode_run = lambda rates: {"images_per_s": sorted(rates)[1], "images_per_s_min": min(rates),  # noqa: E731
                                "images_per_s_max": max(rates), "cpu_s_per_image": 0.002,
                                "runs": [{"repeat": r, "images_per_s": v} for r, v in enumerate(rates)]}
    records = [
        {"plan": {"date": "D", "budget": 480, "limits": 380, "steps": ORDER, "dry_run": False}},
        {"benchmark": "setup", "device": "NVIDIA H200"},
        {"step": "setup", "state": "ok", "rc": 0, "seconds": 5, "limit": 25, "last": "",
         "gpu_before": {"values": "1980 MHz, 3201 MHz, 31, 0x0000000000000000"},
         "gpu_after": {"values": "1980 MHz, 3201 MHz, 33, 0x0000000000000004"}},
        {"benchmark": "correctness", "checks": {
            "uint8 equal, process backend, 2 epochs": {"ok": True, "detail": "equal"},
            "uint8 equal, thread backend, 2 epochs": {"ok": False, "detail": "epoch 1: batch 3: 2 of 64 differ"},
            "normalized within 1e-5": {"ok": True, "detail": ""},
            gpu_summary.PIXELS: {"ok": True, "detail": "64 images: mean |gpu - cpu| 0.412 levels"}}},
        {"benchmark": "bench_gpu_train", "results": {"resnet50": {
            "fastload": feed(runs("resnet50", "fastload", [4700], 0.02, 4))}}},
        {"benchmark": "bench_gpu_train", "results": {"resnet18": {k: feed(v) for k, v in r18.items()}},
         "dataloader": {"workers": 16, "prefetch_factor": 4}, "versions": {"timm": "1.0.0"}},
        # A model the step stopped within: its runs so far stand in for it, marked.
        *runs("resnet101", "fastload", [1500, 1700], 0.1),
        *runs("resnet101", "DataLoader best", [900], 0.5),
        {"benchmark": "bench_gpu_decode", "batch_size": 256, "workers": 14, "repeats": 3, "timed_batches": 100,
         "decode": {"cpu": decode_run([7000, 7200, 7100]), "gpu": decode_run([11000, 10500, 10600]),
                    gpu_summary.TORCHVISION: decode_run([6000, 6100, 6200])}},
    ]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": "h2d", "sta')  # cut short
    lines = gpu_summary.render(gpu_summary.load(str(jsonl)))
    text = "\n".join(lines)
    assert lines[0] == "gpu-check D on NVIDIA H200" and "1 of 8 steps ok" in lines[1]
    assert "throttle reasons active at: setup" in text
    assert "MISSED uint8 batches byte-identical to the CPU's" in text and "2 of 64 differ" in text
    assert 'met    decode="gpu" pixels within 1 level mean of the CPU path: 64 images' in text
    assert "met    ResNet-50 data wait < 5% with 4 workers: 2.0% (fastload, 4 workers" in text
    # The best mode (gpu+cpu) against the model alone and the better peer of each repeat: the
    # second repeat's DataLoader (8600) brings the smallest ratio under 1.5x.
    assert ("met    ResNet-18 fastload's best mode >= 95% of the model alone: median 95% (per repeat 95% to 97%, "
            "3 repeats) (fastload gpu+cpu)") in text
    assert ("MISSED ResNet-18 fastload's best mode >= 1.5x the better peer, every repeat: median 2.07x (per repeat "
            "1.49x to 2.12x, 3 repeats) (fastload gpu+cpu)") in text
    assert 'MISSED decode="gpu" >= 1.5x the CPU default (14 workers): median 1.49x (per repeat 1.46x to 1.57x' in text
    assert "-      both decoders" in text and "no gpu+cpu mode: left out of --modes, or the Loader takes no share option" in text
    assert "-      H2D stage >= 85% of the plain copy timed the same way, 14 workers: not measured" in text
    assert "met    timing: >= 3 repeats of >= 100 timed steps: ResNet-18 3 x 100; decode 3 x 100" in text
    assert "  model alone           13200  13250  13300    0.0%   20.0  3 run(s), 0 workers" in text
    assert "resnet101: images/s min / median / max, data wait, step ms (PARTIAL" in text
    assert "  fastload               1500   1600   1700   10.0%   20.0  2 run(s), 14 workers" in text
    assert "DataLoader best: 16 workers, prefetch_factor 4 (swept); timm 1.0.0" in text
    assert "  torchvision decode_jpeg cuda   6000   6100   6200  2.00" in text
    assert len(lines) <= 45, "one screen"


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
    assert d["workers"] == 14 and d["batch"] == 256 and d["repeats"] >= 3 and d["timed"] >= 100, d
    assert d["warmup"] >= d["workers"], d  # start-up behind
    assert d["epoch"] >= (d["warmup"] + d["timed"] + 2 * d["workers"]) * d["batch"], d
    t = bench_gpu_train.sizes(bench_gpu_train.arguments().parse_args([]))
    assert t["workers"] == 14 and t["batch"] == 256 and t["repeats"] >= 3 and t["steps"] >= 100, t
    assert t["r50_workers"] == 4 and t["r50_repeats"] == 1 and t["dl_workers"] == [8, 14, 16], t
    # A run takes warmup + steps batches; the most a loader holds ahead: its workers x prefetch_factor.
    assert t["epoch"] >= (t["warmup"] + t["steps"] + max(t["dl_workers"]) * max(t["dl_prefetch"])) * t["batch"], t
    assert t["warmup"] >= 2 * max(t["dl_workers"]), t


def test_the_torchvision_peer_runs_in_the_first_decode_repeat_only(monkeypatch):
    import bench_gpu_decode

    ran = []
    monkeypatch.setattr(bench_gpu_decode, "gpu_clocks", lambda when: {"when": when})
    monkeypatch.setattr(bench_gpu_decode, "report", lambda *a: None)
    monkeypatch.setattr(bench_gpu_decode, "timed", lambda make, *a: ran.append(make()) or
                        {"images_per_s": 100.0, "cpu_s_per_image": None, "run_s": 1.0})
    makers = {"cpu": lambda: "cpu", "gpu": lambda: "gpu", bench_gpu_decode.TORCHVISION: lambda: "tv"}
    args = bench_gpu_decode.arguments().parse_args([])
    out = bench_gpu_decode.repeats_of(makers, 3, 1, 1, None, args, "decode", once=(bench_gpu_decode.TORCHVISION,))
    assert ran == ["cpu", "gpu", "tv", "gpu", "cpu", "cpu", "gpu"], ran
    assert out["repeats_done"] == 3 and len(out["modes"][bench_gpu_decode.TORCHVISION]["runs"]) == 1


def test_runs_are_interleaved_and_ratios_taken_per_repeat():
    import bench_gpu_train
    import gpu_common

    assert gpu_common.interleaved("ABC", 3) == [(0, "A"), (0, "B"), (0, "C"), (1, "C"), (1, "B"), (1, "A"),
                                                (2, "A"), (2, "B"), (2, "C")]
    assert gpu_common.spread([3, 1, 2]) == {"min": 1, "median": 2, "max": 3}
    rows = lambda rates: [{"repeat": r, "images_per_s": v} for r, v in enumerate(rates)]  # noqa: E731
    q = bench_gpu_train.ratios({"fastload": rows([90, 100]), "fastload gpu": rows([50, 60]),
                                "DataLoader best": rows([60, 40]), "timm create_loader": rows([30, 50]),
                                "model alone": rows([100, 100])})
    assert q["best_mode"] == "fastload"
    assert q["vs_better_peer"]["per_repeat"] == [1.5, 2.0] and q["vs_model_alone"]["min"] == 0.9


def test_modes_map_to_loader_options_and_the_share_hook_is_skipped_without_the_option(monkeypatch):
    import gpu_common

    import fastload as fl

    assert gpu_common.mode_options("cpu") == {"decode": "cpu"}
    if not gpu_common.share_accepted():
        assert gpu_common.mode_options("gpu") == {"decode": "gpu"}
        assert gpu_common.mode_options("gpu+cpu") is None
    real = fl.Loader.__init__

    def with_share(self, *args, gpu_cpu_share="auto", **kwargs):  # a Loader that takes the option
        real(self, *args, **kwargs)

    monkeypatch.setattr(fl.Loader, "__init__", with_share)
    assert gpu_common.GPU_SHARE_OPTION == "gpu_cpu_share"
    assert gpu_common.mode_options("gpu") == {"decode": "gpu", "gpu_cpu_share": None}
    assert gpu_common.mode_options("gpu+cpu", gpu_common.share_value("0.25")) == {"decode": "gpu",
                                                                                   "gpu_cpu_share": 0.25}
    assert gpu_common.share_value("auto") == "auto" and gpu_common.share_value("none") is None
    with pytest.raises(SystemExit, match="unknown decode mode"):
        gpu_common.modes_list("cpu,gpu2")


def test_cpu_meter_counts_the_workers():
    import multiprocessing

    import gpu_common

    meter = gpu_common.CpuMeter()
    meter.start()
    ctx = multiprocessing.get_context("fork")
    burned, release = [ctx.Event() for _ in range(2)], ctx.Event()
    procs = [ctx.Process(target=_burn, args=(0.3, done, release)) for done in burned]
    for p in procs:
        p.start()
    for done in burned:
        assert done.wait(60)
    seconds = meter.stop()  # the children alive, as in a timed window
    release.set()
    for p in procs:
        p.join()
    assert seconds is not None and seconds >= 0.55, seconds  # 2 x 0.3 s of CPU, less a clock tick each


def _burn(cpu_seconds, done, release):
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass
    done.set()
    release.wait(60)


def test_gpu_clocks_are_read_only_and_bounded(monkeypatch):
    calls = []

    def fake_run(argv, **kwargs):
        calls.append((argv, kwargs))
        if "clocks_throttle_reasons" in argv[1]:
            return subprocess.CompletedProcess(argv, 2, "", 'Field "clocks_throttle_reasons.active" is not valid')
        return subprocess.CompletedProcess(argv, 0, "clocks.sm [MHz], ...\n1980 MHz, 3201 MHz, 35, 0x0\n", "")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    got = gpu_check.gpu_clocks()
    assert got["values"] == "1980 MHz, 3201 MHz, 35, 0x0"
    assert all(argv[0] == "nvidia-smi" and argv[1].startswith("--query-gpu=") and kw["timeout"] <= 10
               for argv, kw in calls)
    assert "clocks_event_reasons.active" in calls[-1][0][1]

    def hung(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(gpu_check.subprocess, "run", hung)
    assert "TimeoutExpired" in gpu_check.gpu_clocks()["error"]


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
    batch, targets = bench_gpu_train.uint8_collate([ds[i] for i in range(4)])
    assert batch.dtype == torch.uint8 and batch.shape == (4, 3, 32, 32) and targets.tolist() == labels[:4]
    prefetcher = bench_gpu_train.SideStreamPrefetcher([(batch, targets)], torch.device("cpu"))
    (got, got_y), = list(prefetcher)
    want = (batch.double() / 255 - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(
        1, 3, 1, 1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    assert got.is_contiguous(memory_format=torch.channels_last) and torch.equal(got_y, targets)


def test_the_torchvision_peer_crops_like_random_resized_crop():
    import random

    import bench_gpu_decode
    import torch

    rng = random.Random(0)
    for _ in range(200):
        h, w = rng.randint(20, 500), rng.randint(20, 500)
        top, left, ch, cw = bench_gpu_decode.crop_box(h, w, rng)
        assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w and ch > 0 and cw > 0
    images = [torch.randint(0, 256, (3, 40 + i, 50), dtype=torch.uint8) for i in range(3)] + [
        torch.randint(0, 256, (1, 30, 30), dtype=torch.uint8)]
    feed = bench_gpu_decode.TorchvisionGpu([(images, torch.arange(4))], torch.device("cpu"), lambda d: d)
    (x, y), = list(feed)
    assert x.shape == (4, 3, 224, 224) and x.dtype == torch.float32 and torch.isfinite(x).all()
    assert y.tolist() == [0, 1, 2, 3]


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
    feeds = {"fastload", "fastload gpu", "DataLoader best", "timm create_loader", "model alone"}
    assert set(trained) - {"fastload gpu+cpu"} == feeds, trained  # gpu+cpu: where the Loader takes the option
    assert all(len(r["runs"]) == 2 for r in trained.values())  # the dry run's 2 repeats
    assert {"fastload", "fastload gpu"} <= set(gpu_summary.trained(records)["resnet50"])
    traces = {r["mode"]: r["trace"] for r in records if r.get("benchmark") == "bench_gpu_train_trace"}
    assert set(traces) >= {"gpu", "cpu"} and all(t["device_events"] == 0 for t in traces.values()), traces
    benchmarks = {r["benchmark"] for r in records if "benchmark" in r}
    assert {"photos", "gpu_decode_probe", "correctness", "bench_gpu_train", "bench_gpu_train_sweep",
            "bench_gpu_decode", "bench_gpu_decode_run", "bench_h2d"} <= benchmarks
    probe = [r for r in records if r.get("benchmark") == "gpu_decode_probe" and "config" in r]
    assert probe and not [r for r in probe if r.get("error")], probe
    train = gpu_summary.latest(records, "bench_gpu_train", "versions")
    assert train["versions"]["timm"] and train["dataloader"]["workers"] in (1, 2)
    decode = gpu_summary.latest(records, "bench_gpu_decode")
    assert {"cpu", "gpu", gpu_summary.TORCHVISION} <= set(decode["decode"]), decode["decode"]
    # CPU seconds were read for every mode. Clocks tick every 10 ms: a dry run's few batches of a
    # fast mode may take under a tick on this machine, so 0 is a reading (CI saw one), None is not.
    assert all(m["cpu_s_per_image"] is not None and m["cpu_s_per_image"] >= 0 for m in decode["decode"].values())
    assert any(m["cpu_s_per_image"] > 0 for m in decode["decode"].values())
    assert set(gpu_summary.latest(records, "bench_gpu_decode", "recipe")["recipe"]) == {"fastload", "timm"}
    correctness = next(r for r in records if r.get("benchmark") == "correctness")
    assert all(c["ok"] for c in correctness["checks"].values()) and len(correctness["checks"]) == 5
    assert all("gpu_before" in r and "gpu_after" in r for r in steps.values())
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


def test_the_trace_adds_busy_time_per_stream_and_kind_and_counts_overlap():
    import gpu_trace

    ms = 1_000_000
    events = [("volta_sgemm", 7, 0, 10 * ms), ("volta_sgemm", 7, 5 * ms, 12 * ms),  # one stream: 12 ms busy
              ("nvjpeg::idct_kernel", 9, 8 * ms, 20 * ms), ("_rows", 9, 20 * ms, 22 * ms),
              ("Memcpy HtoD (Pinned -> Device)", 11, 30 * ms, 31 * ms)]
    s = gpu_trace.summarize(events, steps=2)
    assert s["window_ms"] == 31 and s["window_ms_per_step"] == 15.5
    assert s["busy_ms"] == 23  # [0, 22) and [30, 31)
    assert s["streams"]["7"]["busy_ms"] == 12 and s["streams"]["9"]["busy_ms"] == 14
    assert s["overlap_ms"] == 12 + 14 + 1 - 23  # streams 7 and 9 ran together from 8 to 12 ms
    assert s["kinds_ms"] == {"copy": 1, "decode": 12, "model": 12, "rows": 2}
    assert list(s["streams"]) == ["9", "7", "11"]  # busiest first
    assert gpu_trace.summarize([], steps=2)["device_events"] == 0


def test_the_cuda_matrix_runs_last_in_its_step():
    files = gpu_check.cuda_test_files()
    assert files[-1] == os.path.join("tests", gpu_check.MATRIX_TESTS), files
    assert len(files) > 1 and files[:-1] == sorted(files[:-1])
