"""A LightningModule trained on fastload: one process, or DDP (``--devices 2``, or under torchrun).

    python examples/lightning_train.py DATA --devices 1
    torchrun --nproc_per_node=2 examples/lightning_train.py DATA --devices 2

DATA holds ``train/<class>/*.jpg`` and ``val/<class>/*.jpg``. Pass the Loaders straight to
``trainer.fit``: a ``fl.Loader`` is not a DataLoader, so Lightning injects no
DistributedSampler (``use_distributed_sampler=False`` is not needed); each Loader reads the
rank from ``torch.distributed`` once the Trainer has started it, so each rank gets its own
shard, and it follows Lightning's ``sampler.set_epoch`` calls. Batches arrive normalized, on
the device the Loader chose (CUDA when there is one): on CPU they stay on the CPU.
"""

import argparse
import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

import fastload as fl


class Classifier(pl.LightningModule):
    def __init__(self, num_classes: int, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=4),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, num_classes),
        )

    def forward(self, images):
        return self.net(images)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        self.log("val_loss", F.cross_entropy(logits, labels), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == labels).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--out", default="lightning_logs")
    args = parser.parse_args(argv)

    train = fl.ImageFolder(os.path.join(args.data, "train"), transform=fl.transforms.train(args.image_size))
    val = fl.ImageFolder(os.path.join(args.data, "val"), transform=fl.transforms.eval(args.image_size))
    train_loader = fl.Loader(train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, seed=0)
    val_loader = fl.Loader(val, batch_size=args.batch_size, num_workers=args.workers)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        devices=args.devices,
        accelerator="auto",
        strategy="ddp" if args.devices > 1 else "auto",
        default_root_dir=args.out,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(len(train.classes)), train_dataloaders=train_loader, val_dataloaders=val_loader)
    train_loader.close()
    val_loader.close()
    if trainer.global_rank == 0:
        print(
            f"done: {trainer.current_epoch} epochs, val_acc {trainer.callback_metrics['val_acc']:.3f}, "
            f"checkpoint {trainer.checkpoint_callback.best_model_path}"
        )


if __name__ == "__main__":
    main()
