"""Batch augmentations on the device: ``fl.Loader(..., batch_transform=[...])``.

Each batch transform is called on the normalized batch where it lives (the GPU when there
is one) as ``f(images, targets, generator) -> (images, targets)``, with a
``torch.Generator`` seeded from (seed, epoch, rank, batch): the same draws for any number
of workers, either backend, and after resuming. Provided here:

- :class:`Mixup` (timm's ``timm.data.Mixup``: Mixup and CutMix, per batch, pair or
  element, label smoothing) and :class:`RandomErasing` (timm's);
- :class:`MixUp`, :class:`CutMix` and :class:`RandomChoice` (torchvision's v2 forms);
- :class:`ImagesOnly`: adapts a callable of the images alone (a kornia pipeline).
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
