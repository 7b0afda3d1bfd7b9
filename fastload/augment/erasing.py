"""timm's RandomErasing (``timm.data.random_erasing.RandomErasing``) on a normalized batch, drawn on the device.

timm loops over the images and, for each box, over up to 10 attempts in Python. Here every
image's boxes and all their attempts are drawn at once as tensors; the first attempt that
fits the image is kept (as timm keeps it), and the boxes become one mask over the batch.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import check_images, count, number
from .mixing import on_host
from .sampling import fresh_generator, integers, normal_like, uniform

ERASE_MODES = ("const", "rand", "pixel")
ATTEMPTS = 10  # timm's tries per box before it gives the box up


class ErasingBoxes:
    """The drawn boxes of one batch: ``active`` (N × K bool: the box exists) and ``box``
    (N × K × 4 int64: y0, y1, x0, x1, half-open), K = ``max_count``."""

    def __init__(self, active: torch.Tensor, box: torch.Tensor) -> None:
        self.active, self.box = active, box

    def masks(self, height: int, width: int) -> torch.Tensor:
        """bool N × K × H × W: the pixels each active box covers."""
        ys = torch.arange(height, device=self.box.device).view(1, 1, height, 1)
        xs = torch.arange(width, device=self.box.device).view(1, 1, 1, width)
        y0, y1, x0, x1 = (self.box[..., k, None, None] for k in range(4))
        return self.active[..., None, None] & (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)


class RandomErasing:
    """Erases random rectangles of each image with timm's arguments and meaning.

    Each image (after the first ``N // num_splits`` when ``num_splits > 1``: timm's clean
    split) is erased with probability ``probability``: a count drawn from [min_count,
    max_count], and for each box up to 10 attempts at an area of U(min_area, max_area) ·
    image area / count and an aspect ratio log-uniform in [min_aspect, max_aspect]; the
    first attempt that fits is placed uniformly. The box is filled with 0 ("const"), one
    N(0, 1) value per channel ("rand") or N(0, 1) per pixel ("pixel"): the values of
    normalized pixels. Later boxes of an image paint over earlier ones, as in timm.

    Draws come from the batch's generator on its device: no host sync, no per-image Python.

    Args:
        probability: Probability that an image is erased.
        min_area: Smallest erased fraction of the image area (per image, before ``/ count``).
        max_area: Largest erased fraction.
        min_aspect: Smallest aspect ratio (height / width) of a box.
        max_aspect: Largest; None means ``1 / min_aspect``.
        mode: "const", "rand" or "pixel".
        min_count: Fewest boxes per erased image.
        max_count: Most boxes; None means ``min_count``.
        num_splits: With > 1, the first ``N // num_splits`` images are left clean (timm's
            augmentation splits).
        device: Accepted for timm's signature; the noise is drawn on the batch's device.

    Raises:
        ValueError: A bad argument (the message names it).
    """

    def __init__(
        self,
        probability: float = 0.5,
        min_area: float = 0.02,
        max_area: float = 1 / 3,
        min_aspect: float = 0.3,
        max_aspect: float | None = None,
        mode: str = "const",
        min_count: int = 1,
        max_count: int | None = None,
        num_splits: int = 0,
        device: Any = "cuda",
    ) -> None:
        self.probability = number("probability", probability, 0.0, 1.0)
        self.min_area = number("min_area", min_area, 0.0, 1.0)
        self.max_area = number("max_area", max_area, 0.0, 1.0)
        if self.min_area > self.max_area:
            raise ValueError(f"min_area must be <= max_area, got min_area={min_area!r}, max_area={max_area!r}")
        min_aspect = number("min_aspect", min_aspect, 0.0, open_low=True)
        max_aspect = 1 / min_aspect if max_aspect is None else number("max_aspect", max_aspect, 0.0, open_low=True)
        if min_aspect > max_aspect:
            raise ValueError(f"min_aspect must be <= max_aspect, got {min_aspect!r} and {max_aspect!r}")
        self.log_aspect_ratio = (math.log(min_aspect), math.log(max_aspect))
        if not isinstance(mode, str) or mode.lower() not in ERASE_MODES + ("",):
            raise ValueError(f"mode must be one of {ERASE_MODES}, got {mode!r}")
        self.mode = mode.lower() or "const"  # timm reads '' as const
        self.min_count = count("min_count", min_count, 1)
        self.max_count = self.min_count if max_count is None else count("max_count", max_count, 1)
        if self.max_count < self.min_count:
            raise ValueError(f"max_count must be >= min_count ({self.min_count}), got {max_count!r}")
        self.num_splits = count("num_splits", num_splits, 0)
        try:
            self.device = torch.device(device) if device is not None else None
        except (RuntimeError, TypeError):
            raise ValueError(f"device must be a torch device or its name, got {device!r}") from None

    def draw(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> ErasingBoxes:
        """The boxes of one batch of ``batch_size`` images of ``height`` × ``width``."""
        n, k = batch_size, self.max_count
        shape = (n, k, ATTEMPTS)
        erase = uniform((n,), generator) < self.probability
        if self.num_splits > 1:
            erase[: n // self.num_splits] = False
        boxes = integers(self.min_count, self.max_count + 1, (n,), generator)
        area = uniform(shape, generator, self.min_area, self.max_area) * (height * width) / boxes.view(n, 1, 1)
        aspect = torch.exp(uniform(shape, generator, *self.log_aspect_ratio))
        h = torch.round(torch.sqrt(area * aspect)).long()  # half to even, as Python's round
        w = torch.round(torch.sqrt(area / aspect)).long()
        fits = (h < height) & (w < width)
        first = fits.to(torch.uint8).argmax(dim=-1, keepdim=True)  # timm keeps the first attempt that fits
        h, w = h.gather(-1, first).squeeze(-1), w.gather(-1, first).squeeze(-1)
        top = integers(0, height - h + 1, (n, k), generator)
        left = integers(0, width - w + 1, (n, k), generator)
        slot = torch.arange(k, device=generator.device).view(1, k)
        active = erase.view(n, 1) & (slot < boxes.view(n, 1)) & fits.any(dim=-1)
        return ErasingBoxes(active, torch.stack([top, top + h, left, left + w], dim=-1))

    def __call__(self, images: torch.Tensor, targets: Any = None, generator: torch.Generator | None = None) -> Any:
        """Erases boxes of ``images`` in place (as timm's) and returns them.

        Called as a batch transform, ``(images, targets, generator)`` → ``(images, targets)``
        with ``targets`` untouched; called on images alone (as timm's), returns the images.
        A single C×H×W image is erased as a batch of one.
        """
        if isinstance(images, torch.Tensor) and images.dim() == 3:  # one C×H×W image, as timm takes too
            self(images[None], None, generator)
            return images if targets is None else (images, targets)
        images = check_images(images, "RandomErasing")
        generator = generator if generator is not None else fresh_generator(images.device)
        n, c, height, width = images.shape
        boxes = self.draw(n, height, width, generator)
        colors = None
        if self.mode == "rand":
            colors = torch.randn((n, self.max_count, c), generator=generator, device=generator.device)
            colors = colors.to(images.device, images.dtype)
        if on_host(images):
            self._paint_boxes(images, boxes, colors, generator)
        else:
            self._paint_masks(images, boxes, colors, generator)
        return images if targets is None else (images, targets)

    def _paint_masks(
        self, images: torch.Tensor, boxes: ErasingBoxes, colors: torch.Tensor | None, generator: torch.Generator
    ) -> None:
        """On a device: the boxes as masks over the whole batch, a few launches, no host read."""
        covered = boxes.masks(*images.shape[-2:]).to(images.device)  # N × K × H × W
        if self.mode == "const":
            images.masked_fill_(covered.any(dim=1, keepdim=True), 0.0)
        elif self.mode == "pixel":
            mask = covered.any(dim=1, keepdim=True)
            images.copy_(torch.where(mask, normal_like(images, generator), images))
        elif colors is not None:
            for slot in range(self.max_count):  # later boxes paint over earlier ones, as in timm
                images.copy_(torch.where(covered[:, slot, None], colors[:, slot, :, None, None], images))

    def _paint_boxes(
        self, images: torch.Tensor, boxes: ErasingBoxes, colors: torch.Tensor | None, generator: torch.Generator
    ) -> None:
        """In host memory: box by box, touching only the erased pixels (timm's order)."""
        for i, (row_active, row_boxes) in enumerate(zip(boxes.active.tolist(), boxes.box.tolist())):
            for slot, (active, (y0, y1, x0, x1)) in enumerate(zip(row_active, row_boxes)):
                if not active:
                    continue
                region = images[i, :, y0:y1, x0:x1]
                if self.mode == "const":
                    region.zero_()
                elif colors is not None:  # "rand"
                    region.copy_(colors[i, slot].view(-1, 1, 1).expand_as(region))
                else:
                    noise = torch.randn(region.shape, generator=generator, device=generator.device)
                    region.copy_(noise)

    def __repr__(self) -> str:
        return (
            f"RandomErasing(probability={self.probability}, mode={self.mode!r}, "
            f"count=({self.min_count}, {self.max_count}))"
        )
