"""What a torchvision (or timm) transform given as a fastload transform should be instead.

torchvision's transforms take PIL images or C×H×W tensors; fastload's take the uint8
H×W×C numpy array the decoder made (and v2 transforms pass such arrays through
untouched, so a torchvision pipeline would silently do nothing). :func:`foreign_error`
names the fastload equivalent of each step.
"""

from __future__ import annotations

from typing import Any

_ON_DEVICE = "drop it: the Loader makes the tensor on the device"
# torchvision (v1 and v2) class name -> the fastload form of that step.
EQUIVALENTS = {
    "ToTensor": _ON_DEVICE,
    "PILToTensor": _ON_DEVICE,
    "ToImage": _ON_DEVICE,
    "ToDtype": _ON_DEVICE + " (float, or uint8 with normalize=False)",
    "ConvertImageDtype": _ON_DEVICE + " (float, or uint8 with normalize=False)",
    "ToPILImage": "drop it: fastload transforms work on the decoded numpy array",
    "RandomErasing": "fl.augment.RandomErasing(...) as fl.Loader(..., batch_transform=...) (on the device, per batch)",
    "MixUp": "fl.augment.MixUp(...) as fl.Loader(..., batch_transform=...) (on the device, per batch)",
    "CutMix": "fl.augment.CutMix(...) as fl.Loader(..., batch_transform=...) (on the device, per batch)",
    "RandomResizedCropAndInterpolation": "fl.transforms.RandomResizedCrop(size, scale, ratio)",
    "MaybeToTensor": _ON_DEVICE,
}
# Same name, same arguments in fastload.transforms.
SAME_NAME = (
    "RandomResizedCrop",
    "Resize",
    "CenterCrop",
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "RandomCrop",
    "ColorJitter",
    "RandomGrayscale",
    "GaussianBlur",
    "RandomSolarize",
    "RandAugment",
    "TrivialAugmentWide",
    "AutoAugment",
    "AugMix",
    "RandomApply",
    "RandomInvert",
    "RandomPosterize",
    "RandomEqualize",
    "RandomAutocontrast",
    "RandomAdjustSharpness",
    "Grayscale",
    "Pad",
)


def _library(obj: Any) -> str | None:
    root = type(obj).__module__.split(".")[0]
    return root if root in ("torchvision", "timm") else None


def equivalent(name: str) -> str | None:
    """The fastload form of torchvision's transform ``name`` when it is not a same-named
    fastload transform, else None (for ``fl.transforms.<name>`` looked up by habit)."""
    if name == "Normalize":
        return "drop it: the Loader normalizes on the device: fl.Loader(..., normalize=fl.Normalize(mean=..., std=...))"
    return EQUIVALENTS.get(name)


def _step(t: Any) -> str:
    name = type(t).__name__
    if name == "Normalize":
        mean, std = getattr(t, "mean", None), getattr(t, "std", None)
        values = f"mean={list(mean)}, std={list(std)}" if mean is not None and std is not None else "mean=..., std=..."
        call = f"fl.Loader(..., normalize=fl.Normalize({values}))"
        return f"{name} -> drop it: the Loader normalizes on the device: {call}"
    if name in EQUIVALENTS:
        return f"{name} -> {EQUIVALENTS[name]}"
    if name in SAME_NAME:
        return f"{name} -> fl.transforms.{name}(...)"
    return (
        f"{name} -> no fastload equivalent: write it as f(img, rng) on the uint8 H×W×C array (randomness from rng only)"
    )


def foreign_error(t: Any) -> str | None:
    """The TypeError message for a torchvision/timm transform or Compose, else None."""
    library = _library(t)
    if library is None:
        return None
    steps = list(getattr(t, "transforms", None) or [t]) if type(t).__name__ == "Compose" else [t]
    lines = "\n".join(f"  {_step(s)}" for s in steps)
    return (
        f"{type(t).__name__} is a {library} transform: fastload transforms get the decoded image as a uint8 "
        f"H×W×C numpy array (and f(img, rng) draws from the sample's rng). Use instead:\n{lines}\n"
        f"e.g. transform=[fl.transforms.RandomResizedCrop(224), fl.transforms.RandomHorizontalFlip()] "
        f"and fl.Loader(ds, normalize=fl.Normalize(mean=..., std=...))."
    )
