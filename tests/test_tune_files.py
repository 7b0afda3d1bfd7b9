"""``fastload tune``'s output and its ends: a file that cannot be written is refused before
measuring; a disk that fills while it measures, or Ctrl-C, loses no measurement and leaves no
empty or cut-off file; a dataset too small for the batch sizes tried is said so and saves no
profile (issue 32, items 13 and 16)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from test_tune import TUNE_FAKE, FakeMeasure, _fake_tuner

import fastload as fl
from fastload.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = [*TUNE_FAKE, "--size", "32", "--budget", "10"]


def _small_disk(mount, code: str, env: dict) -> subprocess.CompletedProcess:
    """Runs Python ``code`` with a 2 MB tmpfs on ``mount`` in a private mount namespace; prints
    what is left on it after ``LEFT:``."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("a small disk needs unshare -m (root, or a container that allows mount namespaces)")
    line = (f'mount -t tmpfs -o size=2m tmpfs {mount} && {{ "$0" -c "$1"; rc=$?; echo LEFT:; ls -A {mount}; '
            'exit $rc; }')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]), **env}
    return subprocess.run(["unshare", "-m", "sh", "-c", line, sys.executable, code], capture_output=True, text=True,
                          timeout=300, env=env)


def test_a_full_disk_is_refused_before_measuring(folder, tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    code = f"""
import sys
import fastload.tune as tune
tune.measure_loader = lambda *a, **k: sys.exit("measured before checking --json")
with open("{mount}/fill", "wb") as f:  # the disk is full before the run starts
    try:
        while True:
            f.write(bytes(1 << 16)); f.flush()
    except OSError:
        pass
from fastload.cli import main
sys.exit(main(["tune", "{folder}", "--json", "{mount}/t.json"]))
"""
    proc = _small_disk(mount, code, {})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--json {mount}/t.json: {mount} cannot take a 1 MB file (No space left on device)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.split("LEFT:")[1].split() == ["fill"], "the probe file was left behind"


def test_a_disk_that_fills_while_measuring_loses_no_measurement(folder, tmp_path):
    """The check passes; the disk fills during the run: no t.json at all (not an empty one), the
    error names the file and the reason, and the whole report is kept in the temporary folder."""
    mount, kept = tmp_path / "disk", tmp_path / "tmp"
    mount.mkdir()
    kept.mkdir()
    code = f"""
import sys
import fastload.tune as tune
from test_tune import FakeMeasure
fake = FakeMeasure(lambda c: 100 + 50 * c.num_workers)
def measure(*a, **k):
    if len(fake.calls) == 3:  # another program fills the disk while the tuner measures
        with open("{mount}/fill", "wb") as f:
            try:
                while True:
                    f.write(bytes(1 << 16)); f.flush()
            except OSError:
                pass
    return fake(*a, **k)
tune.measure_loader, tune.clock = measure, fake.clock
tune.bottleneck = lambda *a: {{"stages_samples_per_s": {{"storage": 1e9}}, "bound_by": "storage",
                               "pipeline_share_of_bound": 0.0, "decode_per_core": 1.0}}
from fastload.cli import main
sys.exit(main(["tune", "{folder}", *{FAKE!r}, "--json", "{mount}/t.json"]))
"""
    proc = _small_disk(mount, code, {"TMPDIR": str(kept)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.split("LEFT:")[1].split() == ["fill"], "an empty or partial report was left on the disk"
    message = next(line for line in proc.stderr.splitlines() if "error:" in line)
    assert f"cannot write --json {mount}/t.json (No space left on device); kept in {kept}/" in message, message
    report = json.loads(open(message.split("kept in ")[1].split(" instead")[0]).read())
    assert len(report["measurements"]) == 4 and report["best"]["num_workers"] == 4
    assert "* chosen:" in proc.stdout, "the table is printed before the file is written"


def test_a_failed_write_is_an_error_and_the_report_is_kept(folder, tmp_path, monkeypatch, capsys):
    """Without a small disk: /dev/full refuses every write (ENOSPC) and passes the check (not a regular file)."""
    if not os.access("/dev/full", os.W_OK):
        pytest.skip("needs a writable /dev/full")
    _fake_tuner(monkeypatch, tmp_path, FakeMeasure(lambda c: 100 + 50 * c.num_workers))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    assert main(["tune", folder, *FAKE, "--json", "/dev/full"]) == 1
    err = capsys.readouterr().err
    assert "cannot write --json /dev/full (No space left on device); kept in " in err
    kept = err.split("kept in ")[1].split(" instead")[0]
    assert os.path.dirname(kept) == str(tmp_path) and json.loads(open(kept).read())["best"]["num_workers"] == 4


def test_a_write_that_fails_midway_leaves_the_old_file_as_it_was(tmp_path):
    from fastload.tune.files import write_whole

    out = tmp_path / "t.json"
    out.write_text("old")

    def half(f):
        f.write("{")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_whole(str(out), half)
    assert out.read_text() == "old" and os.listdir(tmp_path) == ["t.json"]
    write_whole(str(out), lambda f: f.write("new"))
    assert out.read_text() == "new" and os.listdir(tmp_path) == ["t.json"]


def test_ctrl_c_keeps_the_measurements_made_and_saves_nothing_else(folder, tmp_path, monkeypatch, capsys):
    fake = FakeMeasure(lambda c: 100 + 50 * c.num_workers)

    def measure(*a, **k):
        if len(fake.calls) == 3:
            raise KeyboardInterrupt
        return fake(*a, **k)

    _fake_tuner(monkeypatch, tmp_path, fake)
    monkeypatch.setattr("fastload.tune.measure_loader", measure)
    out = tmp_path / "t.json"
    try:
        rc = main(["tune", folder, *FAKE, "--json", str(out), "--save-profile"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the tuner as a raw KeyboardInterrupt")
    assert rc == 130
    err = capsys.readouterr().err
    assert "interrupted after 3 of 4 configurations: nothing chosen, no plot, no profile saved" in err
    report = json.loads(out.read_text())
    assert report["interrupted"] is True and report["best"] is None
    assert [m["num_workers"] for m in report["measurements"]] == [0, 1, 2]
    assert all(m["samples_per_s"] == 100 + 50 * m["num_workers"] for m in report["measurements"])
    with fl.Loader(fl.ImageFolder(folder), num_workers="auto", device="cpu") as loader:
        assert loader.profile is None


@pytest.mark.slow  # 4-8 s: make test stays under 4 minutes (make test-slow runs it)
def test_ctrl_c_on_a_real_run_ends_its_workers_and_prints_no_traceback(folder, tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C sends) after the first real
    measurement: exit status 130, the measurement kept, every process gone."""
    out = tmp_path / "t.json"
    code = f"""
import sys
import fastload.tune as tune
real = tune.measure_loader
def measure(*a, **k):
    result = real(*a, **k)
    print("MEASURED", flush=True)
    return result
tune.measure_loader = measure
from fastload.cli import main
sys.exit(main(["tune", "{folder}", "--batch-sizes", "8", "--workers", "1,2", "--backends", "process", "--grid",
               "--seconds", "2", "--size", "32", "--json", "{out}"]))
"""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "MEASURED", proc.stderr.read()
        time.sleep(0.5)  # inside the second configuration's run
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted after 1 of 2 configurations" in err, err
    report = json.loads(out.read_text())
    assert report["interrupted"] and [m["num_workers"] for m in report["measurements"]] == [1]
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # no worker of the run is left


def test_a_dataset_smaller_than_two_batches_saves_no_profile(folder, tmp_path, monkeypatch, capsys):
    """24 images and batch sizes 16 and 32: no batch size gives 2 batches an epoch."""
    import fastload.tune as tune

    monkeypatch.setattr(tune, "measure_loader", lambda *a, **k: pytest.fail("measured"))
    assert main(["tune", folder, "--batch-sizes", "16,32", "--save-profile"]) == 2
    err = capsys.readouterr().err
    assert (f"--save-profile refused before measuring: {folder} holds 24 samples: fewer than 2 batches of size "
            "16, 32, so those runs time epoch starts and one short batch") in err
    assert "give --batch-sizes of at most 12" in err


def test_a_small_dataset_is_warned_of_and_a_short_chosen_batch_is_not_saved(folder, tmp_path, monkeypatch, capsys):
    # Batch 16 (one full batch of the 24 images an epoch) measures fastest and is chosen.
    _fake_tuner(monkeypatch, tmp_path, FakeMeasure(lambda c: 100 * c.batch_size + c.num_workers))
    out = tmp_path / "t.json"
    argv = ["--batch-sizes", "8,16", "--workers", "0,1", "--backends", "process", "--grid", "--size", "32"]
    assert main(["tune", folder, *argv, "--json", str(out), "--save-profile"]) == 1
    captured = capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["best"]["batch_size"] == 16
    warning = f"{folder} holds 24 samples: fewer than 2 batches of size 16"
    assert warning in report["warnings"][0] and f"warning: {warning}" in captured.out
    assert f"fastload tune: warning: {warning}" in captured.err, "said before measuring, too"
    assert f"error: no profile saved: {warning}" in captured.err and "saved profile" not in captured.out
    with fl.Loader(fl.ImageFolder(folder), num_workers="auto", device="cpu") as loader:
        assert loader.profile is None


def test_ctrl_c_before_measuring_is_a_line_not_a_traceback(folder, monkeypatch, capsys):
    def opening(*a, **k):
        raise KeyboardInterrupt  # while the dataset is opened (a long scan)

    monkeypatch.setattr("fastload.tune.open_tuned", opening)
    try:
        rc = main(["tune", folder])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the command as a raw KeyboardInterrupt")
    assert rc == 130 and capsys.readouterr().err.strip() == "fastload tune: interrupted"


def test_a_tfrecord_profile_is_found_under_every_spelling_of_its_path(tmp_path, monkeypatch):
    # Issue 40 (trust round 5): tuned as /abs/path, TFRecord files opened as path or ./path missed
    # the profile (defaults instead), and the hint said "fastload tune DATASET --forget".
    from fastload.loading import profiles
    from tfrecord_files import write_shards

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = write_shards(tmp_path / "records", [3, 2])
    monkeypatch.chdir(tmp_path)
    saved = profiles.save(fl.TFRecordDataset(root), {"num_workers": 3, "backend": "thread"}, {})
    for spelling in ("records", "./records", "records/", str(tmp_path / "records" / "part-*")):
        dataset = fl.TFRecordDataset(spelling)
        assert profiles.profile_path(dataset) == saved, spelling
        assert f"`fastload tune {root} --forget`" in profiles.forget_hint(dataset), spelling
    one = str(tmp_path / "records" / "part-00001-of-00002")
    assert f"`fastload tune {one} --forget`" in profiles.forget_hint(fl.TFRecordDataset(one))
