"""Convert any dataset fastload reads into fastload's LMDB layout, TFRecord shards or WebDataset shards.

Output is written under a hidden temporary name and renamed at the end, so an
interrupted run never leaves something that opens as a dataset. Used by ``tools/*.py``.
"""

from .cli import main
from .run import convert, read_all, reencode
from .staging import NO_SPACE_EXIT, NoSpaceError, clean_leftovers
from .verify import VerifyError, verify
from .wds_writer import write_wds
from .writers import write_lmdb, write_tfrecord

__all__ = [
    "NO_SPACE_EXIT",
    "NoSpaceError",
    "VerifyError",
    "clean_leftovers",
    "convert",
    "main",
    "read_all",
    "reencode",
    "verify",
    "write_lmdb",
    "write_tfrecord",
    "write_wds",
]
