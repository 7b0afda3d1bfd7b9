"""What ``on_error="skip"`` replaced: each bad sample listed and counted once per pass."""

from __future__ import annotations

import warnings

from ..batch import SkippedSample
from ..system import user_stacklevel

WARN_EVERY = 100
KEPT = 10_000


class SkipLog:
    """The samples skipped so far (the most recent 10,000 in ``items``), with a warning at
    the first and every 100th."""

    def __init__(self) -> None:
        self.items: list[SkippedSample] = []
        self.count = 0
        self._this_pass: set[tuple[int, int]] = set()  # (epoch, index)

    def new_pass(self) -> None:
        self._this_pass.clear()

    def record(self, skipped: tuple[SkippedSample, ...]) -> None:
        # A bad sample drawn as another's replacement fails again at its own turn (in
        # another worker, maybe): it is one bad sample, listed and counted once.
        fresh = []
        for s in skipped:  # also twice in one batch: as a replacement and at its own turn
            if (s.epoch, s.index) not in self._this_pass:
                self._this_pass.add((s.epoch, s.index))
                fresh.append(s)
        if not fresh:
            return
        before = self.count
        self.count += len(fresh)
        self.items.extend(fresh)
        del self.items[:-KEPT]
        if before == 0 or before // WARN_EVERY != self.count // WARN_EVERY:
            warnings.warn(
                f"fastload: skipped {self.count} bad sample(s) so far (loader.skipped lists them); latest: {fresh[-1]}",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
