"""Run under torchrun by test_wds_ddp.py: each rank reads WebDataset shards from servers on
127.0.0.1 (HTTP and S3, one after the other), runs epochs 0 and 1, hands out K batches of
epoch 2 and saves its state. Sample n's target is n, so the targets say which samples a
rank saw.

``python wds_ddp_worker.py OUT SOURCES_JSON K`` with SOURCES_JSON
``{name: {"urls": ..., "options": {...}, "cache_dir": ...}}``; writes
``OUT/<name>.seen.<rank>.json`` and ``OUT/<name>.state.<rank>.pt``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import fastload as fl

OPTS = dict(batch_size=4, shuffle=True, seed=3, device="cpu", normalize=False)


def dataset(source):
    return fl.WebDataset(source["urls"], fl.transforms.eval(16, resize=20), storage_options=source["options"],
                         cache_dir=source["cache_dir"], window=2, retries=2)


def main(out, sources, k):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name, source in sources.items():
        result = {}
        with fl.Loader(dataset(source), num_workers=2, **OPTS) as loader:
            assert (loader.rank, loader.world_size) == (rank, 2)
            for epoch in (0, 1):  # epochs advance by themselves: no set_epoch
                result[epoch] = {"batches": len(loader), "seen": [i for _, y in loader for i in y.tolist()]}
            it = iter(loader)
            result["taken"] = [i for _ in range(k) for i in next(it)[1].tolist()]
            torch.save(loader.state_dict(), os.path.join(out, f"{name}.state.{rank}.pt"))
        with open(os.path.join(out, f"{name}.seen.{rank}.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
