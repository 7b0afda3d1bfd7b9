"""Happens-before over CUDA streams and the host: vector clocks and the race detector.

Modelled: every stream is an agent with a vector clock; so is the host (one agent for
all host threads: Python's own locks and queues between threads are taken as ordering
them). A kernel or copy enqueued on a stream ticks that stream's clock after joining the
host's (what the host did before the launch happens before the kernel). An event
records its stream's clock; ``wait_event`` joins it into the waiting stream;
``synchronize`` (event, stream, device) and a blocking copy join it into the host.

A device allocation is a :class:`Location` with its last write and the reads since. An
access by agent A races with an earlier access by B (one of them a write) unless A's
clock has seen B's tick of that access. Granularity is the whole allocation, so two
streams writing disjoint rows of one tensor count as a race (fastload never does that).
Not modelled: host threads racing each other, memory orderings finer than an allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST = "host"


class Clock(dict):
    """agent → the last tick of that agent this clock has seen."""

    def join(self, other: dict) -> None:
        for agent, tick in other.items():
            if tick > self.get(agent, 0):
                self[agent] = tick

    def knows(self, agent: str, tick: int) -> bool:
        return self.get(agent, 0) >= tick

    def knows_all(self, other: dict) -> bool:
        return all(self.knows(a, t) for a, t in other.items())


@dataclass(frozen=True)
class Access:
    """One read or write of a location by an agent at its tick, with what did it and where."""

    kind: str  # "read" or "write"
    agent: str
    tick: int
    op: str
    tensor: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind} by {self.op} on {self.agent} (tick {self.tick}) of {self.tensor} at {self.where}"


@dataclass
class Location:
    """A device allocation (a caching-allocator block): its accesses since the last write."""

    name: str
    last_write: Access | None = None
    reads: dict[str, Access] = field(default_factory=dict)

    def access(self, access: Access, clock: Clock) -> list[str]:
        """Records ``access`` made with ``clock``; returns a message per conflict."""
        earlier = [self.last_write] if self.last_write is not None else []
        if access.kind == "write":
            earlier += list(self.reads.values())
        races = [f"RACE on {self.name}: {access}\n    conflicts with {e}\n    (no wait orders them)"
                 for e in earlier if e.agent != access.agent and not clock.knows(e.agent, e.tick)]
        if access.kind == "write":
            self.last_write, self.reads = access, {}
        else:
            self.reads[access.agent] = access
        return races
