"""Run by test_resume.py in fresh processes.

``finish DIR FOLDER``: for each ``DIR/<case>.state.pt`` (with ``DIR/<case>.json`` saying how
to load it), a new Loader over the image folder loads the state and finishes the epoch, then
runs the next; the batches go to ``DIR/<case>.rest.pt``.

Under torchrun (gloo, CPU), over a dataset whose labels are the sample indices:
``save DIR N K``: each rank hands out K batches of epoch 0, then saves its state (no collective);
``resume DIR N``: each rank loads every saved state, finishes epoch 0 and runs epoch 1, and
writes the indices it saw.
"""

import glob
import json
import os
import sys

import torch

import fastload as fl

OPTS = dict(batch_size=5, shuffle=True, seed=5, normalize=False, device="cpu")
DDP_OPTS = dict(batch_size=4, shuffle=True, seed=3, device="cpu")


def finish(out, folder):
    ds = fl.ImageFolder(folder, transform=fl.transforms.train(24))
    for path in sorted(glob.glob(os.path.join(out, "*.state.pt"))):
        case = path[: -len(".state.pt")]
        with open(case + ".json") as f:
            how = json.load(f)
        with fl.Loader(ds, num_workers=how["workers"], backend=how["backend"], **OPTS) as loader:
            loader.load_state_dict(torch.load(path, weights_only=True))
            rest = [(x.clone(), y.clone()) for x, y in loader]
            after = [(x.clone(), y.clone()) for x, y in loader]
        torch.save({"rest": rest, "after": after}, case + ".rest.pt")


def ddp(mode, out, n, k=0):
    import torch.distributed as dist

    from ddp_worker import IndexDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # Each run its own worker setup: the state does not depend on it.
    workers, backend = {1: (0, "process"), 2: (2, "process"), 3: (1, "thread")}[world]
    with fl.Loader(IndexDataset(n), num_workers=workers, backend=backend, **DDP_OPTS) as loader:
        if mode == "save":
            it = iter(loader)
            seen = [i for _ in range(k) for i in next(it)[1].tolist()]
            torch.save(loader.state_dict(), os.path.join(out, f"state.{rank}.pt"))
            result = {"seen": seen}
        else:
            saved = glob.glob(os.path.join(out, "state.*.pt"))  # in no particular order
            loader.load_state_dict([torch.load(p, weights_only=True) for p in saved])
            rest = [y.tolist() for _, y in loader]
            result = {"batches": len(rest), "seen": sum(rest, []), "next": [i for _, y in loader for i in y.tolist()]}
    with open(os.path.join(out, f"{mode}{world}.{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "finish":
        finish(sys.argv[2], sys.argv[3])
    else:
        ddp(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
