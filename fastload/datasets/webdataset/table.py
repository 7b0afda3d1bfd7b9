"""The samples of all shards in flat shared arrays: each one's shard, image and target member.

Which member is a sample's image and which its target is chosen here from the shard
indexes, by extension preference (the first of ``image_exts`` / ``target_exts`` the
sample has), so changing the choice never re-reads a shard.

Targets (explicit, and documented in the README):

- ``.cls`` and ``.txt``: an integer as text (``"7"``), or a class name when ``classes``
  is given (its position there);
- ``.json``: an integer, or an object whose ``json_key`` field (default ``"label"``) is an
  integer or a class name in ``classes``;
- ``label_offset`` is added to every target.

A label must then be an int64 class index, as in every other format: ``0 <= label <
2**63``; a negative or larger one is an error naming the sample (skipped with
``on_error="skip"`` like any unreadable sample).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..storage import SharedArray, StringArray
from .index import ShardId, ShardIndex
from .tar import ShardError

OK, NO_IMAGE, BROKEN = 0, 1, 2
MAX_TARGET_BYTES = 1 << 20
MAX_LABEL = (1 << 63) - 1  # int64, the batch's label dtype


def pick(index: ShardIndex, wanted: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: the member row of its most preferred extension in ``wanted`` (-1: none), and
    that extension's position in ``wanted``."""
    n = len(index.keys)
    row, kind = np.full(n, -1, np.int64), np.full(n, -1, np.int8)
    if not len(index.member_sample):
        return row, kind
    rank_of = np.asarray([wanted.index(e) if e in wanted else len(wanted) for e in index.exts], np.int64)
    ranks = rank_of[index.member_ext]
    order = np.lexsort((ranks, index.member_sample))
    samples = index.member_sample[order]
    firsts = order[np.flatnonzero(np.r_[True, samples[1:] != samples[:-1]])]
    ok = firsts[ranks[firsts] < len(wanted)]
    row[index.member_sample[ok]] = ok
    kind[index.member_sample[ok]] = ranks[ok]
    return row, kind


@dataclass(frozen=True)
class TargetRule:
    """How a target member's bytes become an int label (see the module docstring)."""

    exts: tuple[str, ...]
    json_key: str = "label"
    label_offset: int = 0
    classes: tuple[str, ...] | None = None

    def _label(self, value: object, ext: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return self._checked(value + self.label_offset, value, ext)
        if isinstance(value, str) and self.classes is not None and value in self.classes:
            return self._checked(self.classes.index(value) + self.label_offset, value, ext)
        known = "" if self.classes is None else f" or one of the {len(self.classes)} class names given"
        raise ValueError(f"the .{ext} target {value!r:.80} is not an integer label{known}")

    def _checked(self, label: int, value: object, ext: str) -> int:
        if 0 <= label <= MAX_LABEL:
            return label
        offset = f" + label_offset {self.label_offset}" if self.label_offset else ""
        why = "negative" if label < 0 else "over the int64 range of labels"
        raise ValueError(
            f"the .{ext} target {value!r:.80}{offset} is {why}; labels are class indexes, 0 <= label <= {MAX_LABEL}"
        )

    def parse(self, data: bytes, kind: int) -> int:
        ext = self.exts[kind]
        text = data.decode("utf-8", "replace").strip()
        if ext == "json" or ext.endswith(".json"):
            try:
                value = json.loads(text)
            except ValueError as e:
                raise ValueError(f"the .{ext} target is not JSON: {e}") from None
            if isinstance(value, dict):
                if self.json_key not in value:
                    raise ValueError(f"the .{ext} target has no {self.json_key!r} field (keys: {sorted(value)[:8]})")
                value = value[self.json_key]
            return self._label(value, ext)
        try:
            value = int(text)
        except ValueError:
            value = text
        return self._label(value, ext)


class SampleTable:
    """Every sample's shard, key, image member and target member, in shared arrays.

    Args:
        shards: The shards, in the dataset's order.
        indexes: Their indexes.
        image_exts, target_exts: Extensions in order of preference.
    """

    def __init__(
        self, shards: list[ShardId], indexes: list[ShardIndex], image_exts: Sequence[str], target_exts: Sequence[str]
    ) -> None:
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("shard", "io", "is", "to", "ts", "tk", "problem")}
        keys: list[str] = []
        for i, index in enumerate(indexes):
            n = len(index)
            image, _ = pick(index, list(image_exts))
            target, kind = pick(index, list(target_exts))
            problem = np.where(image < 0, NO_IMAGE, OK).astype(np.int8)
            if index.broken_offset >= 0 and n:
                problem[-1] = BROKEN
            cols["shard"].append(np.full(n, i, np.int32))
            # A sample without an image member is named by its first member's offset (the cut
            # one, with no member read, by where the archive breaks).
            first = np.full(n, max(index.broken_offset, 0), np.int64)
            if len(index.member_sample):
                starts = np.flatnonzero(np.r_[True, index.member_sample[1:] != index.member_sample[:-1]])
                first[index.member_sample[starts]] = index.member_offset[starts]
            cols["io"].append(np.where(image < 0, first, index.member_offset[image]))
            cols["is"].append(np.where(image < 0, 0, index.member_size[image]))
            cols["to"].append(np.where(target < 0, 0, index.member_offset[target]))
            cols["ts"].append(np.where(target < 0, 0, index.member_size[target]))
            cols["tk"].append(kind)
            cols["problem"].append(problem)
            keys.extend(index.keys)

        def shared(name: str, dtype: type) -> SharedArray:
            return SharedArray(np.concatenate(cols[name]) if cols[name] else np.zeros(0), dtype)

        self.shards = shards
        self.counts = SharedArray([len(ix) for ix in indexes], np.int64)
        self.shard, self.problem = shared("shard", np.int32), shared("problem", np.int8)
        self.image_offset, self.image_size = shared("io", np.int64), shared("is", np.int64)
        self.target_offset, self.target_size = shared("to", np.int64), shared("ts", np.int64)
        self.target_kind = shared("tk", np.int8)
        self.keys = StringArray(keys)
        self.broken = [(ix.broken_offset, ix.broken) for ix in indexes]
        self.image_exts = tuple(image_exts)

    def __len__(self) -> int:
        return len(self.shard)

    def where(self, number: int) -> str:
        """``"<url> sample '<key>' at byte <offset>"``."""
        url = self.shards[int(self.shard.array[number])].url
        return f"{url} sample {self.keys[number]!r} at byte {int(self.image_offset.array[number])}"

    def error(self, number: int) -> Exception | None:
        """Why sample ``number`` cannot be read at all (no image member, cut off), or None."""
        problem = int(self.problem.array[number])
        if problem == OK:
            return None
        shard = int(self.shard.array[number])
        url = self.shards[shard].url
        if problem == NO_IMAGE:
            wanted = "/".join("." + e for e in self.image_exts)
            return ShardError(url, None, f"sample {self.keys[number]!r} has no image member ({wanted})")
        offset, problem_text = self.broken[shard]
        return ShardError(url, offset, f"sample {self.keys[number]!r} is cut off: {problem_text}")

    def span(self, numbers: np.ndarray) -> tuple[int, int]:
        """The byte range of the shard that holds the image and target members of ``numbers``."""
        starts = np.concatenate([self.image_offset.array[numbers], self.target_offset.array[numbers]])
        ends = np.concatenate(
            [
                self.image_offset.array[numbers] + self.image_size.array[numbers],
                self.target_offset.array[numbers] + self.target_size.array[numbers],
            ]
        )
        has = np.concatenate([self.problem.array[numbers] == OK, self.target_kind.array[numbers] >= 0])
        return (int(starts[has].min()), int(ends[has].max())) if has.any() else (0, 0)
