"""uint8 N×H×W×C batches → normalized N×C×H×W (channels_last), the same numbers on CPU and GPU."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config import DTYPES, IMAGENET_MEAN, IMAGENET_STD, Normalize, dtype_name, mean_std
from ..views import is_views


class Normalizer:
    """uint8 NHWC → (x/255 - mean)/std as N×C×H×W channels_last, in one multiply-add.

    Args:
        mean: Per-channel mean in [0, 1] units.
        std: Per-channel standard deviation in [0, 1] units.
        dtype: Output dtype ("float32", "float16", "bfloat16" or the torch dtype).
        normalize: False returns the uint8 batch in the same N×C×H×W channels_last layout.
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: str | torch.dtype = "float32",
        normalize: bool = True,
    ) -> None:
        dtype = dtype_name(dtype)
        mean, std = mean_std(mean, std)
        self.dtype = DTYPES[dtype]
        self.normalize = normalize
        # float64 → float32 once, so CPU and GPU use the very same constants.
        self._scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float64).float()
        self._shift = torch.tensor([m / s for m, s in zip(mean, std)], dtype=torch.float64).float()
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        pad = (0.0,) * (4 - len(std)) if len(std) <= 4 else ()
        self._cv_scale = tuple(float(v) for v in self._scale) + pad  # OpenCV takes 4-value scalars
        self._cv_shift = tuple(float(v) for v in self._shift) + pad

    @classmethod
    def of(cls, spec: Normalize | bool) -> Normalizer:
        """The normalizer of a config's ``normalize``: a :class:`fastload.Normalize`, or False
        (the uint8 batch, in the same layout)."""
        if spec is False:
            return cls(normalize=False)
        if not isinstance(spec, Normalize):
            raise TypeError(f"expected fl.Normalize(...) or False, got {spec!r}")
        return cls(spec.mean, spec.std, spec.dtype)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on:
            self._on[device] = (self._scale.to(device), self._shift.to(device))
        return self._on[device]

    def __call__(self, images: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor | list[torch.Tensor]:
        """Normalizes a uint8 N×H×W×C batch, or each view of a multi-view batch (a list back)."""
        if is_views(images):
            return [self(view) for view in images]
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise TypeError(f"expected a uint8 N×H×W×C batch, got {images.dtype} {tuple(images.shape)}")
        if not self.normalize:
            return images.permute(0, 3, 1, 2)
        if images.shape[-1] != len(self._scale):
            channels = images.shape[-1]
            raise ValueError(
                f"batch has {channels} channels but mean/std have {len(self._scale)}: give fl.Loader "
                f"normalize=fl.Normalize(mean=..., std=...) with {channels} values each, or {len(self._scale)}-channel "
                "images (PIL images are converted to RGB; uint8 H×W arrays stay one channel)"
            )
        if images.device.type == "cpu" and images.is_contiguous() and images.shape[-1] <= 4:
            out = self._normalize_cpu(images)
        else:
            scale, shift = self._constants(images.device)
            out = images.to(torch.float32)
            out.mul_(scale).sub_(shift)
        if self.dtype != torch.float32:
            out = out.to(self.dtype)
        # A permute of contiguous NHWC is N×C×H×W with channels_last strides: no copy.
        return out.permute(0, 3, 1, 2)

    def _normalize_cpu(self, images: torch.Tensor) -> torch.Tensor:
        # OpenCV's per-channel multiply and subtract are vectorised and convert uint8 in
        # the same pass: about twice the speed of torch's to(float32).mul_().sub_().
        import cv2

        n, h, w, c = images.shape
        rows = images.numpy().reshape(n * h, w, c)
        out = cv2.multiply(rows, self._cv_scale, dtype=cv2.CV_32F)
        cv2.subtract(out, self._cv_shift, dst=out)
        return torch.from_numpy(out.reshape(n, h, w, c))
