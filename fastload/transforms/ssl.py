"""Multi-view presets of self-supervised recipes: DINO's multi-crop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .color import ColorJitter, GaussianBlur, RandomGrayscale, RandomSolarize
from .compose import Compose
from .crops import RandomHorizontalFlip, RandomResizedCrop
from .multiview import MultiView
from .random_apply import RandomApply

#: DINO's blur: sigma drawn in (0.1, 2.0) (its PIL radius), kernel wide enough for 2.0 (±5.5 sigma).
BLUR_KERNEL = 23
BLUR_SIGMA = (0.1, 2.0)


def dino(
    global_size: int = 224,
    local_size: int = 96,
    n_local: int = 8,
    global_scale: Sequence[float] = (0.4, 1.0),
    local_scale: Sequence[float] = (0.05, 0.4),
    *,
    antialias: bool = True,
    reduced_decode: bool = True,
) -> MultiView:
    """DINO's multi-crop (Caron et al. 2021, ``DataAugmentationDINO`` of its ``main_dino.py``):
    2 global views and ``n_local`` local views of every image, in that order.

    Every view: ``RandomResizedCrop``, a horizontal flip (p 0.5), ``ColorJitter(0.4, 0.4,
    0.2, 0.1)`` applied with p 0.8, ``RandomGrayscale(0.2)``; then a Gaussian blur (sigma
    in (0.1, 2)) with p 1.0 on the first global view, 0.1 on the second (which is also
    solarized at 128 with p 0.2) and 0.5 on the local views. Normalization (ImageNet mean
    and std, DINO's) is the Loader's, on the device. The one difference from DINO's
    torchvision code: crops are resized with antialiased bilinear (torchvision v2's and
    Pillow's), not bicubic.

    Args:
        global_size: Side of the 2 global views.
        local_size: Side of the local views.
        n_local: Number of local views (0: the 2 global views only).
        global_scale: RandomResizedCrop's area range of the global views.
        local_scale: RandomResizedCrop's area range of the local views.
        antialias: Antialiased resize (False: OpenCV's bilinear, faster).
        reduced_decode: Let the shared decode be DCT-scaled when every crop allows it.

    Returns:
        A :class:`MultiView` of ``2 + n_local`` views: ``for views, y in loader`` gives
        ``views[0]``, ``views[1]`` (N×C×global×global) then the local views.

    Raises:
        ValueError: A size, scale or ``n_local`` out of range (the message names it).
    """
    if isinstance(n_local, bool) or not isinstance(n_local, int) or n_local < 0:
        raise ValueError(f"n_local must be an int >= 0, got {n_local!r}")

    def view(size: int, scale: Sequence[float], blur: float, solarize: float = 0.0) -> Compose:
        ts: list[Any] = [
            RandomResizedCrop(size, scale=scale, antialias=antialias),
            RandomHorizontalFlip(0.5),
            RandomApply([ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            RandomGrayscale(0.2),
        ]
        if blur > 0:
            ts.append(RandomApply([GaussianBlur(BLUR_KERNEL, BLUR_SIGMA)], p=blur))
        if solarize > 0:
            ts.append(RandomSolarize(128, p=solarize))
        return Compose(ts, reduced_decode)

    pipelines = [view(global_size, global_scale, 1.0), view(global_size, global_scale, 0.1, 0.2)]
    counts = [1, 1]
    if n_local:
        pipelines.append(view(local_size, local_scale, 0.5))
        counts.append(n_local)
    return MultiView(pipelines, counts, reduced_decode)
