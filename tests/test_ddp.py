import json
import os
import socket
import subprocess
import sys

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("n,workers", [(40, 0), pytest.param(39, 2, marks=pytest.mark.slow)])  # 4 s each
def test_two_ranks_under_torchrun_cover_the_dataset(tmp_path, n, workers):
    out = tmp_path / "seen"
    here = os.path.dirname(__file__)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", os.path.join(here, "ddp_worker.py"), str(out), str(n), str(workers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(here), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"seen.{r}").read_text()) for r in (0, 1)]
    for epoch in ("0", "1"):
        assert ranks[0][epoch]["batches"] == ranks[1][epoch]["batches"]
        seen = ranks[0][epoch]["seen"] + ranks[1][epoch]["seen"]
        assert not set(ranks[0][epoch]["seen"]) & set(ranks[1][epoch]["seen"]) or n % 2
        assert sorted(set(seen)) == list(range(n))
        if n % 2 == 0:
            assert sorted(seen) == list(range(n)), "every index exactly once"
    assert ranks[0]["0"]["seen"] != ranks[0]["1"]["seen"], "set_epoch must reshuffle"
