"""Datasets: encoded bytes + label by index, metadata in shared numpy arrays; any map-style
dataset through WrappedDataset."""

from .base import ImageDataset, sample_rng
from .folder import IMG_EXTENSIONS, ImageFolder, ImageList
from .lmdb_dataset import LMDBDataset
from .open import open_dataset
from .tfrecord import StreamRecord, TFRecordDataset, TFRecordError, TFRecordStream
from .wrap import WrappedDataset

__all__ = [
    "IMG_EXTENSIONS",
    "ImageDataset",
    "ImageFolder",
    "ImageList",
    "LMDBDataset",
    "StreamRecord",
    "TFRecordDataset",
    "TFRecordError",
    "TFRecordStream",
    "WrappedDataset",
    "open_dataset",
    "sample_rng",
]
