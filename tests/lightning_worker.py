"""Run by test_frameworks.py: a Lightning Trainer fits a tiny model on fl.Loader(torch dataset).

Each rank writes the sample indices its training steps saw (``return_index=True``) to
OUT.<rank>. With DEVICES=2, Lightning's DDP strategy starts the second process itself by
running this script again.
"""

import json
import sys

from refs import stub_meta_registrations

stub_meta_registrations()  # before Lightning, which imports torchvision through torchmetrics
import lightning.pytorch as pl  # noqa: E402
import numpy as np
import torch

import fastload as fl


class Squares(torch.utils.data.Dataset):
    """Sample i: an 8x8 image of value i (uint8 numpy), label i % 3."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((8, 8, 3), i, np.uint8), i % 3


class Tiny(pl.LightningModule):
    def __init__(self, out):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 3))
        self.out, self.seen = out, []

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen += idx.tolist()
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self):
        with open(f"{self.out}.{self.global_rank}", "w") as f:
            json.dump({"seen": self.seen, "world_size": self.trainer.world_size}, f)


def main(out, n, devices, workers):
    loader = fl.Loader(Squares(n), batch_size=4, shuffle=True, num_workers=workers, device="cpu",
                       return_index=True)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                         max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(out), train_dataloaders=loader)
    loader.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
