"""Tensors that say they are on ``cuda:k`` but hold CPU data, and the ops on them.

A :class:`SimTensor` is a torch.Tensor subclass over CPU memory whose ``device`` is a
simulated GPU. Its ``__torch_function__`` runs each op on the CPU data at once (values are
always right: a race is *reported*, not produced) and models it as a kernel on the
current stream of the tensor's device: it reads its tensor inputs and writes its new
outputs (or, for an in-place op, ``out=``, ``__setitem__``, its first argument). Views
share their base's block and are no kernel. An op whose result is not a tensor
(``.item()``, ``.tolist()``, ``torch.equal``) copies to the host and blocks it, as CUDA
does; shape and other metadata queries do not. Mixing devices, or a CPU tensor that is
not a scalar, raises as CUDA does; ``.numpy()`` raises.

Transfers (``to``, ``cuda``, ``cpu``, ``copy_`` across devices) follow
:mod:`cudasim.device`: a blocking copy synchronizes the host, a ``non_blocking`` one from
pinned memory is queued and its source watched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from .device import ACTIVE, SimStream, where
from .memory import Block

METADATA = {"__get__", "size", "dim", "stride", "storage_offset", "is_contiguous", "numel", "element_size",
            "data_ptr", "untyped_storage", "_typed_storage", "__len__", "nelement", "ndimension",
            "is_floating_point", "is_complex", "get_device", "__hash__", "__reduce_ex__", "__format__",
            "nbytes", "itemsize", "_is_view", "is_shared", "has_names", "__setstate__",
            "is_pinned", "requires_grad_", "__dir__"}


def describe(t: torch.Tensor) -> str:
    return f"{'x'.join(map(str, t.shape)) or 'scalar'} {str(t.dtype).replace('torch.', '')}"


class SimTensor(torch.Tensor):
    """A tensor on a simulated GPU (its data in CPU memory)."""

    _sim_block: Block

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._sim_block.memory.device

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # no host sync, unlike a real print
        return f"SimTensor({describe(self)}, {self.device}, {self._sim_block.memory.location.name})"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return op(func, args, kwargs or {})


def plain(t: Any) -> Any:
    return t.as_subclass(torch.Tensor) if isinstance(t, SimTensor) else t


def wrap(data: torch.Tensor, block: Block) -> SimTensor:
    out = torch.Tensor._make_subclass(SimTensor, data)
    out._sim_block = block
    return out


def new_on(data: torch.Tensor, device: torch.device, stream: SimStream, what: str) -> SimTensor:
    """``data`` as a fresh allocation on ``device``, allocated on ``stream``."""
    sim = ACTIVE[-1]
    with sim.lock:
        memory = sim.allocator.allocate(device, stream, data.untyped_storage().nbytes(), what)
    return wrap(data, Block(sim.allocator, memory))


def kernel(name: str, stream: SimStream, reads: list, writes: list) -> None:
    """Models one kernel on ``stream`` reading and writing those SimTensors."""
    sim, at = ACTIVE[-1], where()
    tick = sim.launch(stream, name)
    seen = set()
    for kind, tensors in (("read", reads), ("write", writes)):
        for t in tensors:
            location = t._sim_block.memory.location
            if (kind, id(location)) not in seen:
                seen.add((kind, id(location)))
                sim.access(location, kind, stream, tick, name, describe(t), at)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def op(func: Any, args: tuple, kwargs: dict) -> Any:
    """Runs ``func`` on the CPU data and models it as a kernel (see the module docstring)."""
    sim = ACTIVE[-1]
    name = getattr(func, "__name__", str(func))
    if func is torch.Tensor.copy_:
        return copy_(args[0], args[1], bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False)))
    if name == "numpy":
        raise TypeError("can't convert cuda device type tensor to numpy. Use Tensor.cpu() to copy it to the host")
    flat, _ = pytree.tree_flatten((args, kwargs))
    sims = [a for a in flat if isinstance(a, SimTensor)]
    devices = {t.device for t in sims}
    if len(devices) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found {sorted(map(str, devices))}"
                           f" ({name})")
    hosts = [a for a in flat if type(a) is torch.Tensor and a.dim() > 0]
    if hosts and name not in METADATA:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found {sims[0].device} and cpu "
                           f"({name}: {describe(hosts[0])} on the host)")
    device = sims[0].device
    out = func(*pytree.tree_map(plain, args), **pytree.tree_map(plain, kwargs))
    outputs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    if not outputs:
        if name not in METADATA:  # a value for the host: a blocking copy on the current stream
            stream = sim.current_stream(device)
            kernel(f"{name} (to the host)", stream, sims, [])
            sim.host_join(stream.clock)
        return out
    stream = sim.current_stream(device)
    by_storage = {_storage(t): t for t in sims}
    fresh, wrapped = [], {}
    for o in outputs:
        base = by_storage.get(_storage(o)) if o.numel() else None
        if base is not None:
            wrapped[id(o)] = wrap(o, base._sim_block)
        else:
            wrapped[id(o)] = new_on(o, device, stream, f"{name} output")
            fresh.append(wrapped[id(o)])
    in_place = (name.endswith("_") and not name.startswith("__")) or name in ("__setitem__", "__iadd__",
                                                                                "__isub__", "__imul__", "__itruediv__")
    written = fresh + ([args[0]] if in_place and isinstance(args[0], SimTensor) else [])
    if isinstance(kwargs.get("out"), SimTensor):
        written.append(kwargs["out"])
    if written and not name.startswith("empty"):
        kernel(name, stream, sims, written)

    def back(o: Any) -> Any:
        if not isinstance(o, torch.Tensor) or isinstance(o, SimTensor):
            return o
        target = args[0] if in_place and isinstance(args[0], SimTensor) else None
        if target is not None and _storage(o) == _storage(target) and o.shape == target.shape:
            return target  # an in-place op returns its tensor
        return wrapped[id(o)]

    return pytree.tree_map(back, out)


def to_device(src: torch.Tensor, device: torch.device, non_blocking: bool, dtype: Any = None,
              memory_format: Any = None, copy: bool = False) -> torch.Tensor:
    """``src`` (host or device) as a tensor on ``device`` (host or device)."""
    sim = ACTIVE[-1]
    kw = {k: v for k, v in (("dtype", dtype), ("memory_format", memory_format)) if v is not None}
    if device.type == "cuda":
        device = sim.device(device)
    if not isinstance(src, SimTensor):
        if device.type != "cuda":
            return ORIGINAL["to"](src, device, non_blocking=non_blocking, copy=copy, **kw)
        if sim.fail_copy is not None and sim.fail_copy(src):
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated, injected) copying {describe(src)}")
        data = ORIGINAL["to"](src, copy=True, **kw)
        stream = sim.current_stream(device)
        out = new_on(data, device, stream, "host-to-device copy")
        _h2d(src, out, stream, non_blocking)
        return out
    if device.type != "cuda":  # device to host: blocks the host until the copy ran
        stream = sim.current_stream(src.device)
        kernel("device-to-host copy", stream, [src], [])
        sim.host_join(stream.clock)
        return ORIGINAL["to"](plain(src), device, copy=True, **kw)
    if device == src.device:
        changes = copy or any(v is not None and v != getattr(src, k, None) for k, v in kw.items())
        if not changes and memory_format is None:
            return src
        return op(ORIGINAL["to"], (src,), {**kw, "copy": copy})
    stream = sim.current_stream(device)  # peer copy, on the destination's stream
    out = new_on(ORIGINAL["to"](plain(src), copy=True, **kw), device, stream, "peer copy")
    kernel("peer copy", stream, [src], [out])
    return out


def _h2d(src: torch.Tensor, out: SimTensor, stream: SimStream, non_blocking: bool) -> None:
    sim = ACTIVE[-1]
    pinned = sim.pinned.is_pinned(src)
    if non_blocking and not pinned:  # CUDA stages a pageable copy: the host waits for the stream first
        sim.host_join(stream.clock)
        sim.pageable_copies[stream.agent] += 1
    kernel("host-to-device copy", stream, [], [out])
    if not non_blocking:
        sim.host_join(stream.clock)
    elif pinned:
        sim.copy_in_flight(stream, stream.clock[stream.agent], src, f"the host-to-device copy at {where()}")


def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    sim = ACTIVE[-1]
    if isinstance(dst, SimTensor) and not isinstance(src, SimTensor):
        plain(dst).copy_(src)
        _h2d(src, dst, sim.current_stream(dst.device), non_blocking)
        return dst
    if not isinstance(dst, SimTensor):
        stream = sim.current_stream(src.device)
        kernel("device-to-host copy_", stream, [src], [])
        sim.host_join(stream.clock)
        return dst.copy_(plain(src))
    if dst.device != src.device:
        plain(dst).copy_(plain(src))
        kernel("peer copy_", sim.current_stream(dst.device), [src], [dst])
        return dst
    plain(dst).copy_(plain(src))
    kernel("copy_", sim.current_stream(dst.device), [src], [dst])
    return dst


ORIGINAL: dict[str, Any] = {"to": torch.Tensor.to}
