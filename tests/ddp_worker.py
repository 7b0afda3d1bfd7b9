"""Run under torchrun by test_ddp.py: each rank writes the labels-as-indices it saw."""

import json
import sys

import numpy as np
import torch.distributed as dist

import fastload as fl


class IndexDataset(fl.ImageDataset):
    """Sample i is a 2x2 image whose label is i, so batches reveal the indices."""

    def __init__(self, n):
        super().__init__(np.arange(n, dtype=np.int64))

    def load(self, index, epoch=0, seed=0):
        return np.full((2, 2, 3), index % 256, np.uint8), index


def main(out, n, workers):
    dist.init_process_group("gloo")
    ds = IndexDataset(n)
    result = {}
    with fl.Loader(ds, batch_size=4, shuffle=True, seed=3, num_workers=workers, device="cpu") as loader:
        assert (loader.rank, loader.world_size) == (dist.get_rank(), 2)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            result[epoch] = {"batches": len(loader), "seen": [i for _, y in loader for i in y.tolist()]}
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
