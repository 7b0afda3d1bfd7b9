"""TFRecord files of ``tf.train.Example``: map-style through index files, or streamed in slots.

Record framing: uint64 length, masked crc32c of the length, data, masked crc32c of the
data. Index files use the tfrecord package's text format, one ``offset length`` line per
record. fastload's converter also writes ``<stem>.fastload.json`` beside a shard set:
class names and each shard's record count, as plain JSON.
"""

from .dataset import TFRecordDataset
from .example import IMAGE_KEY, LABEL_KEY, example_fields, example_pb2, make_example
from .files import INDEX_SUFFIX, META_SUFFIX, expand_paths, read_meta, record_files, write_meta
from .framing import MAX_RECORD_BYTES, TFRecordError, frame, masked_crc, parse_record
from .index import load_index, read_index
from .stream import StreamRecord, TFRecordStream

__all__ = [
    "IMAGE_KEY",
    "INDEX_SUFFIX",
    "LABEL_KEY",
    "MAX_RECORD_BYTES",
    "META_SUFFIX",
    "StreamRecord",
    "TFRecordDataset",
    "TFRecordError",
    "TFRecordStream",
    "example_fields",
    "example_pb2",
    "expand_paths",
    "frame",
    "load_index",
    "make_example",
    "masked_crc",
    "parse_record",
    "read_index",
    "read_meta",
    "record_files",
    "write_meta",
]
