"""Run by test_resume.py in fresh processes.

``finish DIR FOLDER``: for each ``DIR/<case>.state.pt`` (with ``DIR/<case>.json`` saying how
to load it), a new Loader over the image folder loads the state and finishes the epoch, then
runs the next; the batches go to ``DIR/<case>.rest.pt``.

Under torchrun (gloo, CPU), over a dataset whose labels are the sample indices:
``save DIR N K``: each rank hands out K batches of epoch 0, then saves its state (no collective);
``resume DIR N``: each rank loads every saved state, finishes epoch 0 and runs epoch 1
(:func:`resume`, also called by the test in its own process for one rank), and writes the
indices it saw.
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


def resume(out, n, rank, world):
    """Loads every saved state as rank ``rank`` of ``world``; the rest of epoch 0, and epoch 1."""
    from ddp_worker import IndexDataset

    workers, backend = {1: (0, "process"), 3: (1, "thread")}[world]  # not the saving run's: it does not matter
    with fl.Loader(IndexDataset(n), num_workers=workers, backend=backend, shard=fl.Shard(rank=rank, world_size=world),
                   **DDP_OPTS) as loader:
        saved = glob.glob(os.path.join(out, "state.*.pt"))  # in no particular order
        loader.load_state_dict([torch.load(p, weights_only=True) for p in saved])
        rest = [y.tolist() for _, y in loader]
        return {"batches": len(rest), "seen": sum(rest, []), "next": [i for _, y in loader for i in y.tolist()]}


def ddp(mode, out, n, k=0):
    import torch.distributed as dist

    from ddp_worker import IndexDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "save":
        with fl.Loader(IndexDataset(n), num_workers=2, **DDP_OPTS) as loader:
            assert (loader.rank, loader.world_size) == (rank, world)
            it = iter(loader)
            result = {"seen": [i for _ in range(k) for i in next(it)[1].tolist()]}
            torch.save(loader.state_dict(), os.path.join(out, f"state.{rank}.pt"))  # batches prefetched beyond k
    else:
        result = resume(out, n, rank, world)
    with open(os.path.join(out, f"{mode}{world}.{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "finish":
        finish(sys.argv[2], sys.argv[3])
    else:
        ddp(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
