"""Image files on disk: a folder per class, or a ``relative/path label`` list file."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Union

import numpy as np

from ..decode import MODULE_LIMIT, MaxPixels
from ..verified import NOT_VERIFIED, expected_checksums, load_manifest, manifest_path
from .base import ImageDataset
from .storage import SharedArray, StringArray, as_string_array

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _scan_files(top: str, extensions: tuple[str, ...], prefix: str) -> list[str]:
    """Relative paths of matching files below ``top``, sorted, following symlinks."""
    found: list[str] = []
    stack = [(top, prefix)]
    while stack:
        path, rel = stack.pop()
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_dir():
                    stack.append((entry.path, rel + entry.name + "/"))
                elif entry.name.lower().endswith(extensions):
                    found.append(rel + entry.name)
    found.sort()
    return found


Verified = Union[bool, str, os.PathLike]


def _checksums(root: str, paths: StringArray, verified: Verified) -> SharedArray | None:
    """Each path's CRC32C in the ``fastload verify`` manifest ``verified`` names (True: the
    root's, where there is one), else NOT_VERIFIED; None when no file is verified."""
    if isinstance(verified, bool):
        if not verified or not root:  # no root (paths as given): no folder to hold a manifest
            return None
        manifest = manifest_path(root)
        if not os.path.exists(manifest):
            return None
    elif isinstance(verified, (str, os.PathLike)):
        manifest = os.fspath(verified)
    else:
        raise TypeError(f"verified must be True, False or a manifest's path, got {verified!r}")
    expected = expected_checksums(paths, load_manifest(manifest))
    return SharedArray(expected) if (expected != NOT_VERIFIED).any() else None


class _FileDataset(ImageDataset):
    """Shared reading of files named by relative paths under ``root``."""

    paths: StringArray  # one file per sample: never None here

    def __init__(
        self,
        root: str,
        paths: StringArray,
        labels: Any,
        transform: Any,
        decoder: str | None,
        max_pixels: MaxPixels,
        verified: Verified = True,
    ) -> None:
        super().__init__(labels, transform, decoder, max_pixels=max_pixels)
        if len(paths) != len(self.labels):
            raise ValueError(f"{len(paths)} paths but {len(self.labels)} labels")
        self.root = os.fspath(root)
        self.paths = paths
        self._checksums = _checksums(self.root, paths, verified)

    @property
    def verified_count(self) -> int:
        """How many samples the manifest lists as verified strictly (0 without one)."""
        return 0 if self._checksums is None else int((self._checksums.array != NOT_VERIFIED).sum())

    def verified_checksum(self, index: int) -> int:
        return NOT_VERIFIED if self._checksums is None else int(self._checksums.array[index])

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.paths[index])

    @property
    def targets(self) -> list[int]:
        """The label of every sample, a list (torchvision's ``ImageFolder.targets``); the
        shared array itself is ``labels``."""
        return self.labels.tolist()

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(path, label) of every sample (torchvision's ``ImageFolder.samples``)."""
        return [(self.path(i), int(label)) for i, label in enumerate(self.labels)]

    def describe(self, index: int) -> str:
        return self.path(index)

    def read(self, index: int) -> tuple[bytes, int]:
        with open(self.path(index), "rb") as f:
            return f.read(), int(self.labels[index])


class ImageFolder(_FileDataset):
    """One subfolder per class (``root/<class>/**/<image>``), classes sorted by name.

    Args:
        root: Folder whose subfolders are the classes.
        transform: Applied to each decoded image (see :mod:`fastload.transforms`).
        extensions: File name endings to keep (case-insensitive).
        decoder: Decoder backend name; None picks the best available.
        max_pixels: Pixel limit per image (see :class:`~fastload.datasets.base.ImageDataset`).
        allow_empty: Keep class folders that hold no image (each still gets its class
            index), as torchvision's ``allow_empty``.
        verified: Use the ``fastload verify`` manifest of ``root`` where there is one
            (True), the manifest at this path, or none (False). A file it lists is
            checksummed when read: the same bytes are decoded the cheapest way the crop
            allows, changed bytes are refused (:mod:`fastload.verified`). Files it does
            not list are decoded strictly.

    Raises:
        FileNotFoundError: ``root`` does not exist or is not a folder, or a class folder
            holds no image (named; as torchvision's ImageFolder), or ``verified`` names a
            manifest that does not exist.
        ValueError: No class folder or no image was found, or the manifest is malformed.
        TypeError: ``verified`` is not True, False or a manifest's path.
    """

    classes: list[str]  # the subfolders: never None here

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Any = None,
        *,
        extensions: Iterable[str] = IMG_EXTENSIONS,
        decoder: str | None = None,
        max_pixels: MaxPixels = MODULE_LIMIT,
        allow_empty: bool = False,
        verified: Verified = True,
    ) -> None:
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"ImageFolder root {root!r} does not exist or is not a folder")
        exts = tuple(e.lower() for e in extensions)
        if not exts:
            raise ValueError("extensions is empty")
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise ValueError(f"ImageFolder root {root!r} has no class subfolders")
        paths: list[str] = []
        counts = np.zeros(len(classes), dtype=np.int64)
        for idx, name in enumerate(classes):
            files = _scan_files(os.path.join(root, name), exts, name + "/")
            counts[idx] = len(files)
            paths.extend(files)
        if not paths:
            raise ValueError(f"no images with extensions {exts} under {root!r}")
        empty = [os.path.join(root, name) for name, n in zip(classes, counts) if n == 0]
        if empty and not allow_empty:
            raise FileNotFoundError(
                f"class folder(s) {', '.join(empty)} hold no image with extensions {exts}; "
                "remove them (each would still be a class) or pass allow_empty=True"
            )
        labels = np.repeat(np.arange(len(classes), dtype=np.int64), counts)
        super().__init__(root, StringArray(paths), labels, transform, decoder, max_pixels, verified)
        self.classes = classes
        self.class_to_idx = {c: i for i, c in enumerate(classes)}

    def summary(self) -> dict:
        return {**super().summary(), "root": self.root, "classes": len(self.classes)}


class ImageList(_FileDataset):
    """Images named in a ``relative/path label`` text file (Caffe / ImageNet list format).

    Blank lines and lines starting with ``#`` are skipped; the path may contain spaces
    (the label is the last field).

    Args:
        list_file: The list file.
        root: Folder the paths are relative to (default: the list file's folder).
        transform: Applied to each decoded image.
        decoder: Decoder backend name; None picks the best available.
        max_pixels: Pixel limit per image (see :class:`~fastload.datasets.base.ImageDataset`).
        verified: Use the ``fastload verify`` manifest of ``root`` (paths relative to it)
            where there is one (True), the manifest at this path, or none (False); see
            :class:`ImageFolder`.

    Raises:
        FileNotFoundError: The list file (or the manifest ``verified`` names) does not exist.
        ValueError: A line is malformed (the message gives its number), the list is
            empty, or the manifest is malformed.
        TypeError: ``verified`` is not True, False or a manifest's path.
    """

    def __init__(
        self,
        list_file: str | os.PathLike,
        root: str | os.PathLike | None = None,
        transform: Any = None,
        *,
        decoder: str | None = None,
        max_pixels: MaxPixels = MODULE_LIMIT,
        verified: Verified = True,
    ) -> None:
        list_file = os.fspath(list_file)
        if not os.path.isfile(list_file):
            raise FileNotFoundError(f"list file {list_file!r} does not exist")
        paths, labels = parse_list_file(list_file)
        root = os.path.dirname(os.path.abspath(list_file)) if root is None else os.fspath(root)
        super().__init__(root, StringArray(paths), labels, transform, decoder, max_pixels, verified)
        self.list_file = list_file

    @classmethod
    def from_arrays(
        cls,
        paths: Iterable[str] | StringArray,
        labels: Any,
        root: str | os.PathLike = "",
        transform: Any = None,
        *,
        decoder: str | None = None,
        max_pixels: MaxPixels = MODULE_LIMIT,
        verified: Verified = True,
    ) -> ImageList:
        """Builds the dataset from paths (relative to ``root``) and int labels; ``verified``
        as for the constructor."""
        self = cls.__new__(cls)
        paths = as_string_array(paths)
        if len(paths) == 0:
            raise ValueError("ImageList.from_arrays got no paths")
        _FileDataset.__init__(self, os.fspath(root), paths, labels, transform, decoder, max_pixels, verified)
        self.list_file = None
        return self


def parse_list_file(list_file: str) -> tuple[list[str], np.ndarray]:
    paths: list[str] = []
    labels: list[int] = []
    with open(list_file, encoding="utf-8", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            try:
                if len(parts) != 2:
                    raise ValueError
                label = int(parts[1])
                if label < 0:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"{list_file}:{lineno}: expected 'relative/path label' with a "
                    f"non-negative integer label, got {line!r}"
                ) from None
            paths.append(parts[0])
            labels.append(label)
    if not paths:
        raise ValueError(f"list file {list_file!r} names no images")
    return paths, np.asarray(labels, dtype=np.int64)
