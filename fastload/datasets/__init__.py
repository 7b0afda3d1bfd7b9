"""Datasets: encoded bytes + label by index, metadata in shared numpy arrays; any map-style
dataset through WrappedDataset."""

from .base import ImageDataset, sample_rng
from .folder import IMG_EXTENSIONS, ImageFolder, ImageList
from .lmdb_dataset import LMDBDataset
from .lmdb_guard import LMDBReadError
from .lmdb_size import LMDBChangedError
from .open import open_dataset
from .tfrecord import StreamRecord, TFRecordDataset, TFRecordError, TFRecordStream
from .webdataset import DownloadError, ShardError, ShardRecord, WebDataset
from .wrap import WrappedDataset

__all__ = [
    "DownloadError",
    "IMG_EXTENSIONS",
    "ImageDataset",
    "ImageFolder",
    "ImageList",
    "LMDBChangedError",
    "LMDBDataset",
    "LMDBReadError",
    "ShardError",
    "ShardRecord",
    "StreamRecord",
    "TFRecordDataset",
    "TFRecordError",
    "TFRecordStream",
    "WebDataset",
    "WrappedDataset",
    "open_dataset",
    "sample_rng",
]
