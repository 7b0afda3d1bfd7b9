"""Installs the simulator: patches ``torch.cuda``, ``torch.accelerator``, the factories and
the few Tensor methods that meet host memory, for one test (through ``monkeypatch``).

Patched for every thread: ``torch.cuda`` (is_available, device_count, current_device,
set_device, device, Stream, Event, stream, current_stream, default_stream, set_stream,
synchronize, the memory statistics, empty_cache, mem_get_info, get_device_name),
``torch.accelerator`` (what DataLoader's pin-memory thread calls), the factories
``torch.empty/zeros/ones/full/tensor/as_tensor/arange/randint/rand/randn`` (``device=`` a
GPU, or ``pin_memory=True``) and ``Tensor.to/cuda/cpu/pin_memory/is_pinned/record_stream``. Ops on
device tensors need no patch: :class:`~cudasim.tensor.SimTensor` intercepts them.
Not patched: anything reaching CUDA some other way (``from torch import empty``,
``torch._C``), which then fails loudly, as on a machine without CUDA.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from .device import ACTIVE, SimEvent, SimStream, Simulator
from .tensor import ORIGINAL, SimTensor, kernel, new_on, to_device

FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "as_tensor", "arange", "randint", "rand", "randn")


def _factory(name: str, original: Any) -> Any:
    @functools.wraps(original)
    def make(*args: Any, **kwargs: Any) -> Any:
        sim = ACTIVE[-1]
        device = kwargs.get("device")
        pin = kwargs.pop("pin_memory", False)
        if device is None or torch.device(device).type != "cuda":
            out = original(*args, **kwargs)
            return _pinned(sim, out) if pin else out
        device = sim.device(device)
        data = original(*args, **{**kwargs, "device": "cpu"})
        stream = sim.current_stream(device)
        out = new_on(data, device, stream, f"torch.{name}")
        if name in ("tensor", "as_tensor"):  # a blocking copy of host data
            kernel(f"torch.{name}", stream, [], [out])
            sim.host_join(stream.clock)
        elif name != "empty":
            kernel(f"torch.{name}", stream, [], [out])
        return out

    return make


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    copy = kwargs.pop("copy", False)
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if device is None and not isinstance(self, SimTensor):
        return ORIGINAL["to"](self, *args, copy=copy, **kwargs)
    return to_device(self, device or self.device, non_blocking, dtype, memory_format, copy)


def _cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **_: Any) -> torch.Tensor:
    return to_device(self, ACTIVE[-1].device(device), non_blocking)


def _cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return to_device(self, torch.device("cpu"), False) if isinstance(self, SimTensor) else ORIGINAL["cpu"](self)


def _pin_memory(self: torch.Tensor, *args: Any) -> torch.Tensor:
    if isinstance(self, SimTensor):
        raise RuntimeError(f"cannot pin '{self.device}' memory: only dense CPU tensors can be pinned")
    return _pinned(ACTIVE[-1], self)


def _pinned(sim: Simulator, t: torch.Tensor) -> torch.Tensor:
    sim.contexts.add(sim.current_device())
    return sim.pinned.copy_of(t)


def _record_stream(self: torch.Tensor, stream: SimStream) -> None:
    if not isinstance(self, SimTensor) or not isinstance(stream, SimStream):
        raise RuntimeError(f"record_stream needs a device tensor and a stream, got {type(self).__name__}, {stream!r}")
    self._sim_block.memory.uses.add(stream)


def _is_pinned(self: torch.Tensor, *args: Any) -> bool:
    return not isinstance(self, SimTensor) and ACTIVE[-1].pinned.is_pinned(self)


@contextlib.contextmanager
def _stream(stream: SimStream | None):
    sim = ACTIVE[-1]
    if stream is None:
        yield
        return
    device, previous = sim.current_device(), sim.current_stream(stream.device)
    sim.set_device(stream.device)
    sim.set_stream(stream)
    try:
        yield
    finally:
        sim.set_stream(previous)
        sim.set_device(device)


@contextlib.contextmanager
def _device(device: Any):
    sim = ACTIVE[-1]
    previous = sim.current_device()
    if device is not None and not (isinstance(device, int) and device < 0):
        sim.set_device(device)
    try:
        yield
    finally:
        sim.set_device(previous)


def install(monkeypatch: Any, devices: int = 2, seed: int | None = None) -> Simulator:
    """A new simulator with ``devices`` GPUs, patched in until the test ends."""
    sim = Simulator(devices, seed)
    ORIGINAL.setdefault("cpu", torch.Tensor.cpu)
    index = lambda device=None: sim.device(device).index  # noqa: E731
    alloc = sim.allocator
    cuda = {
        "is_available": lambda: True, "device_count": lambda: devices, "current_device": sim.current_device,
        "set_device": sim.set_device, "device": _device, "Stream": SimStream, "Event": SimEvent,
        "stream": _stream, "current_stream": sim.current_stream,
        "default_stream": lambda d=None: sim.defaults[index(d)],
        "set_stream": sim.set_stream, "synchronize": sim.synchronize, "is_initialized": lambda: True,
        "memory_allocated": lambda d=None: alloc.allocated.get(index(d), 0),
        "memory_reserved": lambda d=None: alloc.reserved(index(d)),
        "max_memory_allocated": lambda d=None: alloc.peak.get(index(d), 0),
        "reset_peak_memory_stats": lambda d=None: alloc.peak.__setitem__(index(d), alloc.allocated.get(index(d), 0)),
        "empty_cache": alloc.empty_cache,
        "mem_get_info": lambda d=None: _mem_get_info(sim, index(d)),
        "get_device_name": lambda d=None: f"Simulated GPU {index(d)}",
        "_sleep": lambda cycles: sim.launch(sim.current_stream(), "_sleep"),  # a long kernel: late anyway
    }
    for name, value in cuda.items():
        monkeypatch.setattr(torch.cuda, name, value)
    accelerator = {"is_available": lambda: True, "current_accelerator": lambda *a: torch.device("cuda"),
                   "current_device_index": sim.current_device, "set_device_index": sim.set_device,
                   "device_count": lambda: devices, "synchronize": sim.synchronize}
    for name, value in accelerator.items():
        monkeypatch.setattr(torch.accelerator, name, value)
    for name in FACTORIES:
        monkeypatch.setattr(torch, name, _factory(name, getattr(torch, name)))
    for name, value in (("to", _to), ("cuda", _cuda), ("cpu", _cpu), ("pin_memory", _pin_memory),
                        ("is_pinned", _is_pinned), ("record_stream", _record_stream)):
        monkeypatch.setattr(torch.Tensor, name, value)
    # A Triton kernel reads its images by address, out of the simulator's sight: GPU decode's
    # row step runs as it does on CUDA without Triton (a float32 F.interpolate per row), whose
    # launches the simulator orders. tests/test_gpu_rows.py checks the kernel's pixels.
    monkeypatch.setattr("fastload.device.gpudecode.rows.triton_available", lambda: False)
    return sim


CAPACITY = 80 * 2**30  # what mem_get_info reports as the total


def _mem_get_info(sim: Simulator, index: int) -> tuple[int, int]:
    total = sim.allocator.capacity or CAPACITY
    used = sim.allocator.reserved(index) + sim.allocator.external.get(index, 0)
    return total - used, total
