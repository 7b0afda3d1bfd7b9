"""WebDataset shards written by the webdataset package, served from 127.0.0.1 over HTTP and
from an S3 server, under torchrun with 2 ranks × 2 workers (one launch reads both): every
sample once per epoch, equal batch counts, a new order each epoch; resuming the
interrupted epoch on 1 rank finishes it exactly once."""

import glob
import json
import os

import pytest
import torch

import fastload as fl

from wds_servers import http_server, s3_server, write_shards
from torchrun import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [7, 5, 6, 8, 4, 6, 5, 7]  # 48 samples: 12 per reading slot, 3 batches of 4 each
N = sum(SIZES)
K = 2  # batches each rank hands out of epoch 2 before its state is saved


def _torchrun(out, sources):
    torchrun(os.path.join(HERE, "wds_ddp_worker.py"), out, json.dumps(sources), K)


def _check(out, name, source):
    ranks = [json.load(open(os.path.join(out, f"{name}.seen.{r}.json"))) for r in (0, 1)]
    for epoch in ("0", "1"):
        assert ranks[0][epoch]["batches"] == ranks[1][epoch]["batches"] == 6, name
        assert sorted(ranks[0][epoch]["seen"] + ranks[1][epoch]["seen"]) == list(range(N)), f"{name}: each sample once"
    assert ranks[0]["0"]["seen"] != ranks[0]["1"]["seen"], f"{name}: the next epoch comes in a new order"
    from wds_ddp_worker import OPTS, dataset

    states = [torch.load(p, weights_only=True) for p in glob.glob(os.path.join(out, f"{name}.state.*.pt"))]
    with fl.Loader(dataset(source), num_workers=0, **OPTS) as loader:  # one rank, one reading slot now
        loader.load_state_dict(states)
        rest = [i for _, y in loader for i in y.tolist()]
    taken = ranks[0]["taken"] + ranks[1]["taken"]
    assert len(taken) == 2 * K * 4
    assert sorted(taken + rest) == list(range(N)), f"{name}: the resumed epoch finishes each sample exactly once"


@pytest.mark.slow  # two ranks under torchrun with local HTTP and S3 servers: 15 s
def test_two_ranks_two_workers_over_http_and_s3_and_resume_on_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    files = write_shards(tmp_path / "data", SIZES)
    with http_server(tmp_path / "data") as (base, hits), s3_server(files) as (bucket, options):
        sources = {"http": {"urls": base + "/shard-{000000..000007}.tar", "options": {},
                            "cache_dir": str(tmp_path / "http-cache")},
                   "s3": {"urls": bucket + "/shard-{000000..000007}.tar", "options": options,
                          "cache_dir": str(tmp_path / "s3-cache")}}
        _torchrun(tmp_path, sources)
        tars = {name: n for name, n in hits.items() if name.endswith(".tar")}  # not the sidecar's lookups
        assert set(tars.values()) == {1} and len(tars) == len(SIZES), ("one download per shard for the machine", tars)
        for name, source in sources.items():
            _check(tmp_path, name, source)
