"""tf.train.Example records: the image and label features fastload reads and writes."""

from __future__ import annotations

from typing import Any

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"


def example_pb2():
    try:
        from tfrecord import example_pb2 as pb
    except ImportError as e:
        raise ImportError("TFRecord support needs the tfrecord package: pip install tfrecord") from e
    return pb


def example_fields(data: Any, image_key: str, label_key: str, where: str) -> tuple[bytes, int]:
    """(encoded image, label) of one serialized Example.

    Raises:
        KeyError: A feature is missing or of the wrong kind (lists what the record has).
        ValueError: The record is not a serialized Example.
    """
    pb = example_pb2()
    try:
        ex = pb.Example.FromString(bytes(data))
    except Exception as e:  # protobuf's DecodeError has no stable import path across versions
        raise ValueError(f"{where}: not a tf.train.Example ({type(e).__name__}: {e})") from e
    feats = ex.features.feature
    missing = [k for k in (image_key, label_key) if k not in feats]
    if missing:
        raise KeyError(f"{where}: feature {missing[0]!r} not in record; it has {sorted(feats)}")
    images = feats[image_key].bytes_list.value
    labels = feats[label_key].int64_list.value
    if not images or not labels:
        raise KeyError(f"{where}: {image_key!r} must be bytes and {label_key!r} int64")
    return images[0], int(labels[0])


def make_example(
    data: bytes, label: int, name: str, class_name: str | None, size: tuple[int, int], fmt: bytes
) -> bytes:
    """A serialized tf.train.Example in the layout of TensorFlow's ImageNet build script.

    The class name goes in both ``image/class/synset`` and ``image/class/text`` (folder
    names are both the id and the text fastload knows).
    """
    pb = example_pb2()

    def b(v: bytes):
        return pb.Feature(bytes_list=pb.BytesList(value=[v]))

    def i(v: int):
        return pb.Feature(int64_list=pb.Int64List(value=[v]))

    h, w = size
    feats = {
        IMAGE_KEY: b(data),
        "image/format": b(fmt),
        LABEL_KEY: i(label),
        "image/height": i(h),
        "image/width": i(w),
        "image/channels": i(3),
        "image/colorspace": b(b"RGB"),
        "image/filename": b(name.encode("utf-8", "surrogateescape")),
    }
    if class_name is not None:
        feats["image/class/synset"] = b(class_name.encode())
        feats["image/class/text"] = b(class_name.encode())
    return pb.Example(features=pb.Features(feature=feats)).SerializeToString()
