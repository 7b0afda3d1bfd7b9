import json
import os

import pytest
from torchrun import torchrun


@pytest.mark.parametrize("n,workers", [(40, 0), pytest.param(39, 2, marks=pytest.mark.slow)])  # 4 s each
def test_two_ranks_under_torchrun_cover_the_dataset(tmp_path, n, workers):
    out = tmp_path / "seen"
    torchrun(os.path.join(os.path.dirname(__file__), "ddp_worker.py"), out, n, workers)
    ranks = [json.loads((tmp_path / f"seen.{r}").read_text()) for r in (0, 1)]
    for epoch in ("0", "1"):
        assert ranks[0][epoch]["batches"] == ranks[1][epoch]["batches"]
        seen = ranks[0][epoch]["seen"] + ranks[1][epoch]["seen"]
        assert not set(ranks[0][epoch]["seen"]) & set(ranks[1][epoch]["seen"]) or n % 2
        assert sorted(set(seen)) == list(range(n))
        if n % 2 == 0:
            assert sorted(seen) == list(range(n)), "every index exactly once"
    assert ranks[0]["0"]["seen"] != ranks[0]["1"]["seen"], "set_epoch must reshuffle"
