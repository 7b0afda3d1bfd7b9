"""Where a Loader is in training: the epoch of each pass, what is consumed of it, and a resumed pass.

:class:`Progress` is the one place the Loader's epoch is kept. Its samplers
(``loader.sampler``, ``loader.batch_sampler``) read and set it through it; batch sources
get the epoch with each pass and every batch request carries it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ..sources import resume
from ..sources.sampler import check_epoch
from ..system import user_stacklevel


@dataclass
class Position:
    """How far the pass of ``epoch`` got: ``consumed`` batches handed to the user, after the
    earlier stages in ``history`` (a resumed epoch); ``done`` once it ended by itself."""

    epoch: int
    history: tuple[resume.Stage, ...] = ()
    consumed: int = 0
    done: bool = False

    def batch_number(self, rank: int, world_size: int) -> int:
        """The number in its epoch of the batch this rank hands out next: ``consumed`` after
        what this rank handed out in the earlier stages of a resumed epoch (of a stage on
        another world size, whose batches were dealt anew: after the most any rank handed out)."""
        before = sum(s.consumed[rank] if s.world_size == world_size else max(s.consumed) for s in self.history)
        return before + self.consumed


class Progress:
    """The epoch counter of a Loader, and the epoch its samplers report.

    Each pass is a new epoch unless ``set_epoch`` said which; a loaded state makes the next
    pass the rest of its epoch (a :class:`~fastload.sources.resume.ResumePoint`). Epochs set
    through a sampler (``loader.sampler.set_epoch``, what Lightning calls) or a watched
    DistributedSampler's ``set_epoch`` (what a DataLoader script calls) are requests the
    Loader adopts when it next looks (:meth:`take_request`; the last one wins).

    Args:
        watched: A DistributedSampler whose ``epoch`` is followed: each change, and its epoch
            when the Loader first looks, is a request.
    """

    def __init__(self, watched: Any = None) -> None:
        self.next_epoch = 0
        self.epoch: int | None = None  # of the current (or last) pass
        self.position: Position | None = None  # of the current (or interrupted) pass
        self.resumed: resume.ResumePoint | None = None  # the next pass, from a loaded state
        self.shown = 0  # what the samplers report: the pass under way, or the next one set
        self._requested: int | None = None
        self._watched = watched
        self._seen: Any = None  # so the watched sampler's epoch at the first look counts

    # ---- the samplers' side (fastload.sources.sampler.EpochClock)

    def request(self, epoch: int) -> None:
        """A sampler's ``set_epoch``: shown at once, adopted when the Loader next looks."""
        self._requested = self.shown = check_epoch(epoch)

    def take_request(self) -> int | None:
        """The epoch asked for through a sampler since the last look, or None."""
        requested, self._requested = self._requested, None
        if requested is None and self._watched is not None and self._watched.epoch != self._seen:
            requested = check_epoch(self._watched.epoch)
        self._forget_requests()
        return requested

    def _forget_requests(self) -> None:
        """Forgets what samplers asked so far (a later call of the Loader's own wins)."""
        self._requested = None
        if self._watched is not None:
            self._seen = self._watched.epoch

    # ---- the Loader's side

    def set_epoch(self, epoch: int) -> None:
        self.next_epoch = self.shown = check_epoch(epoch)
        self.position = None
        self._forget_requests()
        if self.resumed is not None and self.resumed.epoch != self.next_epoch:
            warnings.warn(
                f"fastload: set_epoch({epoch}) after load_state_dict of epoch {self.resumed.epoch}: the "
                f"resumed rest of epoch {self.resumed.epoch} is dropped and epoch {epoch} runs whole "
                f"(call set_epoch({self.resumed.epoch}), or none, to resume)",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
            self.resumed = None

    def start_pass(self) -> tuple[Position, resume.ResumePoint | None]:
        """The new pass's position and, for a resumed epoch, where it resumes."""
        self.epoch, self.next_epoch = self.next_epoch, self.next_epoch + 1
        self.shown = self.epoch
        resumed, self.resumed = self.resumed, None
        self.position = (
            Position(self.epoch) if resumed is None else Position(self.epoch, resumed.history, resumed.start)
        )
        return self.position, resumed

    def next_pass_length(self, full: int) -> int:
        """Batches of the next pass: ``full``, or what is left of a resumed epoch."""
        return full if self.resumed is None else self.resumed.length(full)

    def where(self) -> Position:
        """The pass under way (or interrupted), else the next one."""
        pos = self.position
        if pos is None or pos.done:
            resumed = self.resumed
            pos = (
                Position(self.next_epoch)
                if resumed is None
                else Position(resumed.epoch, resumed.history, resumed.start)
            )
        return pos

    def resume(self, epoch: int, resumed: resume.ResumePoint | None) -> None:
        """The next pass is (the rest of) ``epoch``; a sampler's ``set_epoch`` before this does not undo it."""
        self.next_epoch, self.resumed, self.position = epoch, resumed, None
        self.shown = epoch
        self._forget_requests()
