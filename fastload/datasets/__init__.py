"""Datasets: encoded bytes + label by index, metadata in shared numpy arrays."""

from .base import ImageDataset, sample_rng
from .folder import IMG_EXTENSIONS, ImageFolder, ImageList

__all__ = ["IMG_EXTENSIONS", "ImageDataset", "ImageFolder", "ImageList", "sample_rng"]
