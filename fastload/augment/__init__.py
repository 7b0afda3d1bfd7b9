"""Batch augmentations on the device: ``fl.Loader(..., batch_transform=[...])``.

Each batch transform is called on the normalized batch where it lives (the GPU when there
is one) as ``f(images, targets, generator) -> (images, targets)``, with a
``torch.Generator`` on that device seeded from (seed, epoch, rank, batch number, position
in the list): the same draws for any number of workers, either backend, and after
resuming. Provided here:

- :class:`Mixup` (timm's ``timm.data.Mixup``: Mixup and CutMix, per batch, pair or
  element, label smoothing) and :class:`RandomErasing` (timm's);
- :class:`MixUp`, :class:`CutMix` and :class:`RandomChoice` (torchvision's v2 forms);
- :class:`ImagesOnly`: adapts a callable of the images alone (a kornia pipeline), or of
  (images, targets) (``targets=True``), that draws from torch's global generator.

timm's ImageNet recipe (``--reprob 0.25 --remode pixel --mixup 0.8 --cutmix 1.0
--smoothing 0.1``), in timm's order (its prefetcher mixes in the collate, then erases the
normalized batch; with ``--no-prefetcher`` it erases each image first)::

    loader = fl.Loader(train_set, batch_size=128, shuffle=True, drop_last=True, batch_transform=[
        fl.augment.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000),
        fl.augment.RandomErasing(0.25, mode="pixel")])
    for images, soft_targets in loader:  # soft targets: float32 N × 1000
        loss = SoftTargetCrossEntropy()(model(images), soft_targets)

torchvision's reference recipe (``--mixup-alpha 0.2 --cutmix-alpha 1.0``)::

    batch_transform=fl.augment.RandomChoice([fl.augment.MixUp(alpha=0.2, num_classes=1000),
                                             fl.augment.CutMix(alpha=1.0, num_classes=1000)])

The transforms also work outside a Loader: ``mixup(images, targets)`` draws from a
generator seeded from torch's default one, ``mixup(images, targets, generator)`` from yours.
"""

from .adapters import ImagesOnly
from .apply import BatchTransforms, batch_generator, batch_seed
from .erasing import RandomErasing
from .mixing import MixParams
from .mixup import Mixup
from .torchvision_forms import CutMix, MixUp, RandomChoice

__all__ = [
    "BatchTransforms",
    "CutMix",
    "ImagesOnly",
    "MixParams",
    "MixUp",
    "Mixup",
    "RandomChoice",
    "RandomErasing",
    "batch_generator",
    "batch_seed",
]
