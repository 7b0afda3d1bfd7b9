"""Simulated CUDA devices: streams, events, the host's view of them, copies in flight.

Modelled: ``devices`` GPUs, each with a default stream and any number of side streams; a
current device and a current stream per device for each host thread (as CUDA keeps
them); events recorded on a stream and waited on by streams or the host. Work completes
*late*: an event's ``query()`` says done only once the host already waited on it
(``synchronize``, a blocking copy), so a missing wait is never covered by luck; with a
``seed``, ``query()`` and the allocator's event checks instead say done half the time (the
host then counts as having waited), to explore other orders.

Host-to-device copies from pinned memory are queued: the source is snapshotted when the
copy is enqueued and checked when the host learns the copy ended (or at :meth:`finish`); a
difference means the host rewrote the buffer while the copy could still read it, and is
reported as a race. A ``non_blocking`` copy from pageable memory synchronizes the stream
with the host first (CUDA stages it), and is counted. Not modelled: copy engines,
priorities, graph capture, real timing (``elapsed_time`` returns a fixed 0.1 ms).
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import threading
from collections import Counter
from typing import Any

import torch

from .clocks import Access, Clock, Location
from .memory import CachingAllocator, PinnedHost

ACTIVE: list[Simulator] = []  # the installed simulator (events are made without one in hand)
_HERE = os.path.dirname(__file__)
_TORCH = os.path.dirname(torch.__file__)


def where() -> str:
    """The first caller outside the simulator and torch: file:line (function)."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(_HERE) or f.f_code.co_filename.startswith(_TORCH)):
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.relpath(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"


class SimStream:
    """A stream of one device (``torch.cuda.Stream``'s surface)."""

    _handles = itertools.count(0x1000)

    def __init__(self, device: Any = None, priority: int = 0, *, name: str | None = None) -> None:
        sim = ACTIVE[-1]
        self.sim, self.device = sim, sim.device(device)
        self.cuda_stream = next(self._handles)
        self.agent = f"{self.device}/{name or f'stream{self.cuda_stream:x}'}"
        self.clock = Clock()
        sim.streams[self.cuda_stream] = self

    def wait_event(self, event: SimEvent) -> None:
        self.sim.launch(self, "wait_event")
        if event.clock is not None:
            self.clock.join(event.clock)

    def wait_stream(self, stream: SimStream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = event or SimEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        return self.sim.completes(Clock(self.clock))

    def synchronize(self) -> None:
        self.sim.host_join(self.clock)

    def __repr__(self) -> str:
        return f"<SimStream {self.agent}>"


class SimEvent:
    """``torch.cuda.Event``: never recorded, it counts as complete (as in CUDA)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.sim = ACTIVE[-1]
        self.clock: Clock | None = None
        self.stream: SimStream | None = None

    def record(self, stream: SimStream | None = None) -> None:
        stream = stream or self.sim.current_stream()
        self.sim.launch(stream, "record")
        self.clock, self.stream = Clock(stream.clock), stream

    def wait(self, stream: SimStream | None = None) -> None:
        (stream or self.sim.current_stream()).wait_event(self)

    def query(self) -> bool:
        return self.clock is None or self.sim.completes(self.clock)

    def synchronize(self) -> None:
        if self.clock is not None:
            self.sim.host_join(self.clock)

    def elapsed_time(self, end: SimEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time of an event that has not completed")
        return 0.1


class Simulator:
    """The state behind the patched ``torch.cuda``: see the module docstring."""

    def __init__(self, devices: int = 2, seed: int | None = None) -> None:
        self.count = devices
        self.lock = threading.RLock()
        self.host = Clock()
        self.streams: dict[int, SimStream] = {}
        self.races: list[str] = []
        self.inflight: list[tuple] = []  # (stream agent, tick, source, snapshot, what)
        self.allocator = CachingAllocator(self)
        self.pinned = PinnedHost()
        self.rng = random.Random(seed) if seed is not None else None
        self.pageable_copies: Counter = Counter()  # stream agent → copies that synchronized the host
        self.launches: Counter = Counter()  # host thread name → kernels and copies it enqueued
        # Devices a CUDA context was made on: a launch there, or pinned memory allocated by a
        # thread whose current device it is (CUDA pins host memory in the current context).
        self.contexts: set[int] = set()
        self.fail_copy: Any = None  # fault injection: fail_copy(source) true → that copy raises an OOM
        self._tls = threading.local()
        ACTIVE.append(self)
        self.defaults = {i: SimStream(i, name="default") for i in range(devices)}

    # -- devices and current streams (per host thread) --
    def device(self, device: Any = None) -> torch.device:
        if device is None:
            return torch.device("cuda", self.current_device())
        if isinstance(device, int):
            device = torch.device("cuda", device)
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"expected a CUDA device, got {device}")
        index = self.current_device() if device.index is None else device.index
        if not 0 <= index < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} (simulated: {self.count} devices)")
        return torch.device("cuda", index)

    def current_device(self) -> int:
        return getattr(self._tls, "device", 0)

    def set_device(self, device: Any) -> None:
        self._tls.device = self.device(device).index

    def current_stream(self, device: Any = None) -> SimStream:
        index = self.device(device).index
        return getattr(self._tls, "streams", {}).get(index) or self.defaults[index]

    def set_stream(self, stream: SimStream) -> None:
        if not hasattr(self._tls, "streams"):
            self._tls.streams = {}
        self._tls.streams[stream.device.index] = stream

    # -- happens-before --
    def launch(self, stream: SimStream, op: str) -> int:
        """Enqueues one operation on ``stream``: its tick."""
        with self.lock:
            stream.clock.join(self.host)
            tick = stream.clock.get(stream.agent, 0) + 1
            stream.clock[stream.agent] = tick
            self.launches[threading.current_thread().name] += 1
            self.contexts.add(stream.device.index)
            return tick

    def access(self, location: Location, kind: str, stream: SimStream, tick: int, op: str, tensor: str,
               at: str) -> None:
        with self.lock:
            self.races += location.access(Access(kind, stream.agent, tick, op, tensor, at), stream.clock)

    def host_join(self, clock: dict) -> None:
        with self.lock:
            self.host.join(clock)
            self._retire()

    def completes(self, clock: dict) -> bool:
        """Whether work up to ``clock`` is known done to the host (see the module docstring)."""
        with self.lock:
            if self.host.knows_all(clock):
                return True
            if self.rng is not None and self.rng.random() < 0.5:
                self.host_join(clock)
                return True
            return False

    # -- pinned sources of queued copies --
    def copy_in_flight(self, stream: SimStream, tick: int, source: torch.Tensor, what: str) -> None:
        with self.lock:
            self.inflight.append((stream.agent, tick, source, source.clone(), what))

    def _retire(self, everything: bool = False) -> None:
        keep = []
        for agent, tick, source, snapshot, what in self.inflight:
            if not (everything or self.host.knows(agent, tick)):
                keep.append((agent, tick, source, snapshot, what))
            elif not torch.equal(source, snapshot):
                self.races.append(f"RACE on pinned host memory: a host write to {tuple(source.shape)} "
                                  f"{source.dtype} while {what} on {agent} (tick {tick}) could still read it "
                                  f"(the host rewrote the buffer before waiting for the copy)")
        self.inflight = keep

    def synchronize(self, device: Any = None) -> None:
        index = self.device(device).index
        for s in list(self.streams.values()):
            if s.device.index == index:
                self.host_join(s.clock)

    def finish(self) -> None:
        """The end of the program: every queued copy has read its source by now."""
        with self.lock:
            for s in list(self.streams.values()):
                self.host.join(s.clock)
            self._retire(everything=True)

    def knows(self, event_or_stream: Any) -> bool:
        """Whether the host has waited for (everything before) this event or stream."""
        clock = event_or_stream.clock
        return clock is None or self.host.knows_all(clock)
