"""WebDataset-layout tar shards: local, over HTTP(S), in S3 or anywhere fsspec reaches.

Members are grouped into samples by key (``key.jpg`` + ``key.cls``); shards are indexed
once per machine (member names, offsets and sizes), downloaded whole into a bounded
shared cache ahead of use, and read as a stream split into equal slots (rank × worker)
with a shuffle of shard order and of samples within windows of shards.
"""

from .cache import CacheError, ShardCache
from .dataset import IMAGE_EXTS, TARGET_EXTS, ShardRecord, WebDataset
from .index import ShardId, ShardIndex
from .remote import DownloadError
from .tar import ShardError
from .urls import expand_braces, expand_urls

__all__ = [
    "IMAGE_EXTS",
    "TARGET_EXTS",
    "CacheError",
    "DownloadError",
    "ShardCache",
    "ShardError",
    "ShardId",
    "ShardIndex",
    "ShardRecord",
    "WebDataset",
    "expand_braces",
    "expand_urls",
]
