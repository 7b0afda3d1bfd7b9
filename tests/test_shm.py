"""What the process backend leaves in /dev/shm: nothing, whatever way its loaders, passes and
workers end; and a container's small /dev/shm (Docker: 64 MB) is no limit to the batch size.

Each test runs in a child with a /dev/shm of its own (conftest.run_with_private_shm), so what
is counted there is only what fastload left.
"""

import json

import pytest

from conftest import run_with_private_shm

COMMON = """
import gc, json, os, signal, time
import numpy as np, torch
import fastload as fl

class Pixels(torch.utils.data.Dataset):
    def __init__(self, n, side):
        self.n, self.side = n, side
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return np.full((self.side, self.side, 3), i % 251, np.uint8), i

def shm():
    names = os.listdir("/dev/shm")
    return len(names), sum(os.stat(os.path.join("/dev/shm", n)).st_blocks * 512 for n in names)

def memfds():
    held = sum("memfd:fastload" in os.readlink(f"/proc/self/fd/{f}") for f in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{f}"))
    with open("/proc/self/maps") as f:
        return held + sum("memfd:fastload" in line for line in f)

def loader(n=256, side=64, **kw):
    kw = {"batch_size": 32, "num_workers": 2, "normalize": False, "device": "cpu", "backend": "process", **kw}
    return fl.Loader(Pixels(n, side), **kw)
"""

LEAKS = COMMON + """
before, after = shm(), {}
for _ in range(100):  # closed after one batch: batches in flight, slots lent
    dl = loader()
    next(iter(dl))
    dl.close()
after["closed"] = shm()
for _ in range(200):  # dropped without close()
    dl = loader(num_workers=1)
    next(iter(dl))
    del dl
after["dropped"] = shm()
dl = loader(n=96, persistent_workers=False)
for _ in range(40):  # workers started and ended every pass
    sum(1 for _ in dl)
after["epochs"] = shm()
dl.close()
dl = loader(n=512)
for _ in range(3):  # a worker killed mid-pass: the next pass restarts them
    it = iter(dl)
    next(it)
    os.kill(dl._source.workers._loader._iterator._workers[0].pid, signal.SIGKILL)
    try:
        sum(1 for _ in it)
    except Exception as e:
        assert "worker" in str(e), e
    del it
dl.close()
# The Loader object still exists: close() alone lets go of its slots, once the workers' shutdown
# (in the background) has dropped the batches DataLoader held back (out-of-order ones).
deadline = time.monotonic() + 10
while memfds() and time.monotonic() < deadline:
    time.sleep(0.1)
held = memfds()
del dl
gc.collect()
time.sleep(1)
after["killed"] = shm()
print(json.dumps({"before": before, "after": after, "memfds": held}))
"""


@pytest.mark.slow  # about 20 s: run by make test-slow (.ci/run)
def test_loaders_closed_dropped_passes_ended_and_workers_killed_leave_dev_shm_as_it_was():
    proc = run_with_private_shm(LEAKS, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    for case, files_bytes in found["after"].items():
        assert files_bytes == found["before"], (case, found)
    assert found["memfds"] == 0, "a closed Loader still holds slot memory in the main process"


SMALL = COMMON + """
import sys
batch, side = int(sys.argv[1]), int(sys.argv[2])
size = os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
assert size == 64 * 2**20, size
with loader(n=batch * 3, side=side, batch_size=batch) as dl:
    got = [(len(y), int(x[0, 0, 0, 0])) for x, y in dl]
print(json.dumps({"batches": got, "shm": shm()}))
"""


@pytest.mark.parametrize("batch", [128, 256])
def test_a_64_mb_dev_shm_holds_no_batch_of_the_process_backend(batch):
    """Docker's default /dev/shm: a 256×224×224×3 batch is 38.5 MB, and 2 workers keep up to
    8 of them in flight. torch's shared memory filled it after a second ("unable to allocate
    shared memory ... No space left on device" from inside a worker)."""
    code = SMALL.replace("int(sys.argv[1]), int(sys.argv[2])", f"{batch}, 224")
    proc = run_with_private_shm(code, size="64m")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["batches"] == [[batch, 0], [batch, batch % 251], [batch, 2 * batch % 251]]
    assert found["shm"] == [0, 0]


FULL = COMMON + """
from torch.utils.data import DataLoader
from fastload.collate import alloc_batch

class Big(torch.utils.data.Dataset):  # what a worker does where batches still travel in /dev/shm (streams)
    def __len__(self):
        return 2
    def __getitem__(self, i):
        return alloc_batch((500, 224, 224, 3))  # 71.8 MiB

try:
    next(iter(DataLoader(Big(), batch_size=None, num_workers=1)))
except Exception as e:
    print(json.dumps({"error": str(e)}))
"""


def test_a_worker_that_cannot_fit_a_batch_in_dev_shm_says_what_to_do():
    proc = run_with_private_shm(FULL, size="64m")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    error = json.loads(proc.stdout.splitlines()[-1])["error"]
    assert "/dev/shm (64 MB," in error and "cannot hold the next batch (71.8 MB)" in error
    for fix in ("--shm-size", "--ipc=host", 'backend="thread"', "smaller batch_size"):
        assert fix in error, (fix, error)
