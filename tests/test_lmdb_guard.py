"""The LMDB guard process's waits and deaths (issue 32 items 2, 10, 11, 12): a stopped guard
ends at the guard's own timeout, at the Loader's timeout (also with num_workers=0) or at
close() from another thread; a guard killed from outside is named as such and replaced; a
full disk under lock=True is named, not SIGBUS."""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager

import pytest
from guards import close_guard

import fastload as fl
from fastload.convert import convert
from fastload.datasets import LMDBReadError, lmdb_guard, lmdb_guard_registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = lmdb_guard._SERVER
pytestmark = pytest.mark.needs("lmdb")
OPTS = dict(batch_size=4, device="cpu", normalize=False)


@pytest.fixture(scope="module")
def lmdb_path(folder, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lmdb") / "data.lmdb")
    convert(folder, path, "lmdb", progress=False)
    return path


@pytest.fixture(autouse=True)
def _fresh_guards(lmdb_path):
    close_guard(lmdb_path)
    yield
    close_guard(lmdb_path)


def _guard_pid(path):
    """The pid of this process's running guard of ``path``."""
    real = os.path.realpath(path)
    (guard,) = [g for k, g in lmdb_guard_registry._guards.items() if k[:2] == (real, os.getpid())]
    assert guard.proc is not None and guard.proc.poll() is None
    return guard.proc.pid


@contextmanager
def stopped(pid):
    """SIGSTOP on ``pid`` for the block (then SIGCONT, so nothing is left stopped)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _in_thread(fn, limit):
    """(what ``fn()`` returned or raised, seconds); fails if it has not returned after ``limit`` s."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # the test looks at it
            out["value"] = e

    start = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"still blocked after {limit} s"
    return out["value"], time.monotonic() - start


def test_a_stopped_guard_is_killed_at_its_timeout_and_the_read_retried(lmdb_path):
    ds = fl.LMDBDataset(lmdb_path, guard_timeout=1)
    first, second = ds.read(0), ds.read(1)
    pid = _guard_pid(lmdb_path)
    with stopped(pid), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, seconds = _in_thread(lambda: ds.read(1), 30)
    assert got == second, got
    assert 0.9 < seconds < 15, seconds
    (warning,) = [w for w in caught if "guard process" in str(w.message)]
    assert f"guard process (pid {pid}) did not answer within 1 s reading key b'000000001': it was stopped" in str(
        warning.message
    ) and "a new guard process reads it again" in str(warning.message)
    assert _guard_pid(lmdb_path) != pid
    assert ds.read(0) == first


def _resume_later(pid, seconds):
    """SIGCONT to ``pid`` after ``seconds`` (nothing if it has ended)."""

    def resume():
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    timer = threading.Timer(seconds, resume)
    timer.start()
    return timer


def test_each_read_waits_as_long_as_its_own_dataset_says(lmdb_path):
    """Two datasets of one LMDB share its guard process. The shortest guard_timeout of them was
    every read's: a patient dataset's read of a guard that answers after 2 s was killed at the
    hasty one's 0.5 s, with a warning; now it waits, and the hasty one still ends its own wait."""
    patient = fl.LMDBDataset(lmdb_path, guard_timeout=30)
    hasty = fl.LMDBDataset(lmdb_path, guard_timeout=0.5)
    expected = patient.read(1)
    pid = _guard_pid(lmdb_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.kill(pid, signal.SIGSTOP)
        _resume_later(pid, 2.0)
        got, seconds = _in_thread(lambda: patient.read(1), 30)
    assert got == expected, got
    assert seconds > 1.5 and _guard_pid(lmdb_path) == pid, "the guard was taken for hung"
    assert not [w for w in caught if "guard process" in str(w.message)]
    with stopped(pid), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, seconds = _in_thread(lambda: hasty.read(1), 30)
    assert got == expected and seconds < 10, (got, seconds)
    assert [w for w in caught if "did not answer within 0.5 s" in str(w.message)] and _guard_pid(lmdb_path) != pid


@pytest.mark.parametrize("bad", [0, -1, True, "5"])
def test_guard_timeout_must_be_positive_seconds(lmdb_path, bad):
    with pytest.raises(ValueError, match=f"guard_timeout must be a number of seconds > 0, got {bad!r}"):
        fl.LMDBDataset(lmdb_path, guard_timeout=bad)


def test_close_from_another_thread_ends_a_pass_blocked_on_a_stopped_guard(lmdb_path):
    """num_workers=0: the samples load in the consumer's thread, through the guard (item 2)."""
    ds = fl.LMDBDataset(lmdb_path, fl.transforms.eval(16))
    loader = fl.Loader(ds, num_workers=0, **OPTS)
    batches = iter(loader)
    next(batches)
    with stopped(_guard_pid(lmdb_path)):
        threading.Timer(1.0, loader.close).start()
        got, seconds = _in_thread(lambda: next(batches), 30)
    assert isinstance(got, RuntimeError) and "was closed" in str(got), repr(got)
    assert seconds < 10, seconds


@pytest.mark.parametrize("workers, backend", [(0, "process"), (2, "thread")])
def test_the_loader_timeout_ends_a_wait_on_a_stopped_guard(lmdb_path, workers, backend):
    """timeout= with num_workers=0 is accepted (was torch's AssertionError) and honoured where the
    wait is fastload's own (item 10); a decode thread loads the thread backend's head of each pass."""
    ds = fl.LMDBDataset(lmdb_path, fl.transforms.eval(16))
    with fl.Loader(ds, num_workers=workers, backend=backend, timeout=2, **OPTS) as loader:
        assert len(list(loader)) == len(loader)  # a whole pass within the timeout
        pid = _guard_pid(lmdb_path)
        with stopped(pid):
            got, seconds = _in_thread(lambda: next(iter(loader)), 30)
        assert isinstance(got, fl.WorkerFailure), repr(got)
        # The thread backend's rows plan on several threads: the error is the guard's reader's, or
        # that of a row waiting for it ("held by another thread's read"); both name guard and key.
        assert "timeout=2 s" in str(got), str(got)
        assert re.search(re.escape(f"the LMDB guard of {lmdb_path}") + r".* reading key b'", str(got)), str(got)
        assert "no sample was in flight" not in str(got), str(got)
        assert 1.5 < seconds < 10, seconds
        assert len(list(loader)) == len(loader)  # the next pass has a new guard


def test_close_ends_decode_threads_blocked_on_a_stopped_guard(lmdb_path):
    """A decode thread stuck on the guard held its lock until the guard's timeout: no other read of
    the LMDB in this process (a new Loader) got through meanwhile."""
    ds = fl.LMDBDataset(lmdb_path, fl.transforms.eval(16))
    loader = fl.Loader(ds, num_workers=2, backend="thread", **{**OPTS, "batch_size": 1})
    batches = iter(loader)
    next(batches)
    real = os.path.realpath(lmdb_path)
    (guard,) = [g for k, g in lmdb_guard_registry._guards.items() if k[:2] == (real, os.getpid())]
    ended = []

    def consume():
        try:
            for _ in batches:
                pass
        except RuntimeError as e:
            ended.append(str(e))

    with stopped(_guard_pid(lmdb_path)):
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()  # hands out the batches made, until one waits for the stopped guard
        deadline = time.monotonic() + 10
        while not guard.lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert guard.lock.locked(), "no decode thread met the stopped guard"
        time.sleep(0.3)
        loader.close()
        consumer.join(10)
        assert not consumer.is_alive() and "was closed" in ended[0], ended
        with fl.Loader(ds, num_workers=0, **OPTS) as again:  # while the old guard is still stopped
            got, _ = _in_thread(lambda: len(list(again)), 30)
    assert got == len(again), repr(got)


def _server(tmp_path, body):
    """A guard script that runs ``body`` (with ``marker``, a path) and then the real guard."""
    script = tmp_path / "guard.py"
    script.write_text(
        "import os, runpy, signal, sys\n"
        f"marker = {str(tmp_path / 'marker')!r}\n"
        f"{body}\n"
        f"sys.argv[0] = {SERVER!r}\n"
        f"runpy.run_path({SERVER!r}, run_name='__main__')\n"
    )
    return str(script)


# The guard opens the LMDB, takes a request, and is killed from outside while it answers it (the OOM
# killer's SIGKILL); the first time only, or every time.
KILLED_ONCE = (
    "if not os.path.exists(marker):\n"
    "    open(marker, 'w').close()\n"
    "    sys.stdout.buffer.write(b'R' + bytes(8)); sys.stdout.flush()\n"
    "    sys.stdin.buffer.read(1)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)"
)
KILLED_ALWAYS = (
    "sys.stdout.buffer.write(b'R' + bytes(8)); sys.stdout.flush()\nsys.stdin.buffer.read(1)\n"
    "os.kill(os.getpid(), signal.SIGKILL)"
)


def test_a_guard_killed_from_outside_is_named_and_the_read_retried(lmdb_path, tmp_path, monkeypatch):
    ds = fl.LMDBDataset(lmdb_path)
    expected = ds.read(1)
    close_guard(lmdb_path)
    monkeypatch.setattr(lmdb_guard, "_SERVER", _server(tmp_path, KILLED_ONCE))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ds.read(1) == expected  # the next read works: so must this one
    (warning,) = [str(w.message) for w in caught if "guard process" in str(w.message)]
    assert "was killed by signal SIGKILL reading key b'000000001', from outside: the file is not at fault" in warning
    assert "out-of-memory killer" in warning and "a new guard process reads it again" in warning
    assert "damaged" not in warning and "convert" not in warning


def test_a_guard_killed_twice_is_an_error_that_does_not_blame_the_file(lmdb_path, tmp_path, monkeypatch):
    ds = fl.LMDBDataset(lmdb_path)
    close_guard(lmdb_path)
    monkeypatch.setattr(lmdb_guard, "_SERVER", _server(tmp_path, KILLED_ALWAYS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(LMDBReadError, match=r"killed by signal SIGKILL reading key b'000000001', from outside") as e:
            ds.read(1)
    assert "second guard process too" in str(e.value) and "damaged" not in str(e.value)


FULL_DISK = r"""
import errno, os, shutil, sys
import fastload as fl
src, disk, guard = sys.argv[1], sys.argv[2], {"auto": None, "off": False}[sys.argv[3]]
path = os.path.join(disk, "data.lmdb")
os.makedirs(path)
shutil.copyfile(os.path.join(src, "data.mdb"), os.path.join(path, "data.mdb"))
try:  # fill the disk
    with open(os.path.join(disk, "filler"), "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
except OSError as e:
    assert e.errno == errno.ENOSPC, e
try:
    ds = fl.LMDBDataset(path, guard=guard, lock=True)
    ds.read(0)
    print("READ")
except Exception as e:
    print("ERROR", type(e).__name__, getattr(e, "errno", None), str(e).replace("\n", " "))
"""


@pytest.mark.parametrize("guard", ["auto", "off"])
def test_lock_true_on_a_full_disk_names_the_full_disk(lmdb_path, tmp_path, guard):
    """lmdb's lock file on a full disk was SIGBUS: the guard's death blamed the data file, a direct
    reader (a process-backend worker) died ("insufficient shared memory" under torch)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    size = os.path.getsize(os.path.join(lmdb_path, "data.mdb"))
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = f"mount -t tmpfs -o size={size // 1024 + 64}k tmpfs {disk}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here (not root?): {probe.stderr.strip()}")
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh", sys.executable, "-c", FULL_DISK,
         lmdb_path, str(disk), guard],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 0, f"died with {proc.returncode} (SIGBUS is -7): {proc.stderr[-2000:]}"
    out = proc.stdout.strip()
    assert out.startswith("ERROR OSError 28 "), out + proc.stderr[-2000:]
    assert f"no space left on the disk of its lock file {disk}/data.lmdb/lock.mdb" in out and "lock=False" in out, out


def test_a_process_with_over_1024_files_open_reads_through_its_guard(lmdb_path):
    """A training process may hold thousands of files: the guard's pipe then gets a descriptor
    above select()'s 1024 ("filedescriptor out of range in select()"); its waits use poll."""
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        ds = fl.LMDBDataset(lmdb_path)
        assert ds.read(1) == fl.LMDBDataset(lmdb_path).read(1) and ds.read(1)[0]
    finally:
        for fd in held:
            os.close(fd)
