"""TFRecord files written byte by byte for tests (independent of fastload's own writer).

crc32c and tfrecord are imported where used, so a test module can import these helpers
where the packages are missing and its tests skip (``@pytest.mark.needs("tfrecord")``).
"""

import gzip
import struct

from conftest import jpeg_bytes, make_image


def masked(data: bytes) -> int:
    import crc32c

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def framed(data: bytes) -> bytes:
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked(head)) + data + struct.pack("<I", masked(data))


def example(image: bytes, label: int) -> bytes:
    from tfrecord import example_pb2 as pb

    feats = {"image/encoded": pb.Feature(bytes_list=pb.BytesList(value=[image])),
             "image/class/label": pb.Feature(int64_list=pb.Int64List(value=[label]))}
    return pb.Example(features=pb.Features(feature=feats)).SerializeToString()


def tiny_jpeg(seed: int) -> bytes:
    return jpeg_bytes(make_image(seed, 8, 8))


def write_records(path, labels, gz: bool = False, first_seed: int = 0) -> list[int]:
    """Writes one Example per label (a distinct tiny JPEG each); returns the record offsets."""
    offsets, raw = [], b""
    for k, label in enumerate(labels):
        offsets.append(len(raw))
        raw += framed(example(tiny_jpeg(first_seed + k), label))
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(raw)
    return offsets


def write_shards(root, sizes, gz: bool = False) -> str:
    """Files part-K-of-N under ``root`` with the given record counts; record n has label n
    and image tiny_jpeg(n). Returns ``root``."""
    import os

    os.makedirs(root, exist_ok=True)
    first = 0
    for k, n in enumerate(sizes):
        name = f"part-{k:05d}-of-{len(sizes):05d}" + (".gz" if gz else "")
        write_records(os.path.join(root, name), range(first, first + n), gz, first)
        first += n
    return str(root)
