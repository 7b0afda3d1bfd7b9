"""Where a Loader is in training: the epoch of each pass, what is consumed of it, and a resumed pass."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..sources import resume
from ..sources.sampler import check_epoch
from .passes import user_stacklevel


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
    """The epoch counter of a Loader.

    Each pass is a new epoch unless ``set_epoch`` said which; a loaded state makes the next
    pass the rest of its epoch (a :class:`~fastload.sources.resume.Plan`).
    """

    def __init__(self) -> None:
        self.next_epoch = 0
        self.epoch: int | None = None  # of the current (or last) pass
        self.position: Position | None = None  # of the current (or interrupted) pass
        self.plan: resume.Plan | None = None  # the next pass, from a loaded state

    def set_epoch(self, epoch: int) -> None:
        self.next_epoch = check_epoch(epoch)
        self.position = None
        if self.plan is not None and self.plan.epoch != self.next_epoch:
            warnings.warn(
                f"fastload: set_epoch({epoch}) after load_state_dict of epoch {self.plan.epoch}: the "
                f"resumed rest of epoch {self.plan.epoch} is dropped and epoch {epoch} runs whole "
                f"(call set_epoch({self.plan.epoch}), or none, to resume)",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
            self.plan = None

    def start_pass(self) -> tuple[Position, resume.Plan | None]:
        """The new pass's position and, for a resumed epoch, its plan."""
        self.epoch, self.next_epoch = self.next_epoch, self.next_epoch + 1
        plan, self.plan = self.plan, None
        self.position = Position(self.epoch) if plan is None else Position(self.epoch, plan.history, plan.start)
        return self.position, plan

    def next_pass_length(self, full: int) -> int:
        """Batches of the next pass: ``full``, or what is left of a resumed epoch."""
        plan = self.plan
        if plan is None:
            return full
        if plan.length is not None:
            return plan.length
        return len(plan.requests) if plan.history else max(0, full - plan.start)

    def where(self) -> Position:
        """The pass under way (or interrupted), else the next one."""
        pos = self.position
        if pos is None or pos.done:
            plan = self.plan
            pos = Position(self.next_epoch) if plan is None else Position(plan.epoch, plan.history, plan.start)
        return pos

    def resume(self, epoch: int, plan: resume.Plan | None) -> None:
        self.next_epoch, self.plan, self.position = epoch, plan, None
