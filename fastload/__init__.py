"""fastload: feed PyTorch image training as fast as the hardware allows.

Data flows one way: datasets (encoded bytes + label) → decode → uint8 transforms → the
batch builder (:mod:`fastload.sources`: rows written into reused buffers, in worker
processes or threads; DDP sharding) → the device stage (copy, normalization and layout
change) → batch augmentations on the device (:mod:`fastload.augment`).
"""

from . import augment, transforms
from .batch import HostBatch, SampleError, SkippedSample
from .collate import fast_collate
from .config import LoaderConfig, Normalize, Shard
from .dataloader import DataLoader
from .datasets import (
    DownloadError,
    ImageDataset,
    ImageFolder,
    ImageList,
    LMDBDataset,
    ShardError,
    ShardRecord,
    StreamRecord,
    TFRecordDataset,
    TFRecordError,
    TFRecordStream,
    WebDataset,
    WrappedDataset,
    open_dataset,
)
from .datasets.sampleplan import SamplePlan
from .datasets.storage import SharedArray, StringArray
from .decode import DecodeError, decode_image, get_decoder, image_size
from .device.normalize import Normalizer
from .device.prefetch import CudaPrefetcher
from .encoded import EncodedBatch
from .loader import Loader
from .sources.failures import WorkerFailure, WorkersReplaced
from .sources.resume import merge_states
from .sources.sampler import ShardedBatchSampler

__version__ = "0.1.0"

__all__ = [
    "CudaPrefetcher",
    "DataLoader",
    "DecodeError",
    "DownloadError",
    "EncodedBatch",
    "HostBatch",
    "ImageDataset",
    "ImageFolder",
    "ImageList",
    "LMDBDataset",
    "Loader",
    "LoaderConfig",
    "Normalize",
    "Normalizer",
    "SampleError",
    "SamplePlan",
    "Shard",
    "ShardError",
    "ShardRecord",
    "ShardedBatchSampler",
    "SharedArray",
    "SkippedSample",
    "StreamRecord",
    "StringArray",
    "TFRecordDataset",
    "TFRecordError",
    "TFRecordStream",
    "WebDataset",
    "WorkerFailure",
    "WorkersReplaced",
    "WrappedDataset",
    "augment",
    "decode_image",
    "fast_collate",
    "get_decoder",
    "image_size",
    "merge_states",
    "open_dataset",
    "transforms",
]
