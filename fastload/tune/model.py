"""``fastload tune --model``: a model's training step rate and the largest batch that fits.

The largest batch is found by trial on the device: doubling from the smallest batch size
asked for until a step runs out of memory, then bisecting between the last batch that
fitted and the first that did not. A step that runs out of memory (torch's
OutOfMemoryError, or cuDNN's or cuBLAS's allocation failures, which arrive as RuntimeErrors)
is caught, what it held is released (gradients dropped, reference cycles collected, the
allocator's cache emptied) and the search goes on.

Each trial runs beside a block as large as what the Loader itself keeps on the GPU during
training at that batch size (:func:`loader_device_bytes`), so the batch found leaves room
for it. Not counted: memory outside torch's allocator, such as nvImageCodec's pool with
``decode="gpu"`` (its size is only known on a GPU).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

LIMIT = 16384  # no search beyond this batch size
GRAIN = 8  # batch sizes found by bisection are multiples of this (when at least this large)
#: What cuDNN and cuBLAS say when an allocation fails (PyTorch raises these as RuntimeError).
OUT_OF_MEMORY = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says the device ran out of memory."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and any(m in str(error) for m in OUT_OF_MEMORY)
    )


def loader_device_bytes(batch_size: int, size: int, out_bytes: int = 4, channels: int = 3) -> int:
    """Device memory a Loader holds during training at ``batch_size``: the batch handed out
    and the ones queued ahead (``DEVICE_AHEAD``), each as its uint8 copy and its normalized
    output of ``out_bytes`` per value."""
    from ..config import DEVICE_AHEAD

    return (DEVICE_AHEAD + 1) * batch_size * channels * size * size * (1 + out_bytes)


def create_model(name: str) -> nn.Module:
    """A torchvision model by name, else a timm one."""
    try:
        from torchvision.models import get_model

        return get_model(name)
    except (ImportError, ValueError):
        pass
    try:
        import timm
    except ImportError:
        raise ImportError(f"--model {name!r} needs torchvision or timm installed") from None
    return timm.create_model(name)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def try_batch(
    step: Callable[[int], None], batch_size: int, release: Callable[[], None], device: torch.device, reserve: int = 0
) -> bool:
    """Whether one ``step(batch_size)`` runs beside ``reserve`` bytes held on the device; when
    it runs out of memory, ``release()``, reference cycles are collected and the allocator's
    cache is emptied before returning False. Other errors propagate."""
    held = None
    try:
        if reserve:
            held = torch.empty(reserve, dtype=torch.uint8, device=device)  # what the Loader keeps there
        step(batch_size)
        sync(device)
        return True
    except Exception as e:  # noqa: BLE001 (re-raised unless it is an out-of-memory error)
        if not is_out_of_memory(e):
            raise
    finally:
        del held
    # Outside the except clause: its traceback, whose frames hold the step's tensors, is gone.
    release()
    gc.collect()  # tensors kept by reference cycles (autograd graphs, frames) are freed before...
    if device.type == "cuda":
        torch.cuda.empty_cache()  # ...the allocator gives its cached blocks back
    return False


def largest_batch(fits: Callable[[int], bool], start: int, limit: int = LIMIT) -> int:
    """The largest batch size ``fits`` accepts: doubling from ``start``, then bisecting to a
    multiple of GRAIN. 0 when even ``start`` does not fit; at most ``limit``."""
    if start < 1:
        raise ValueError(f"start must be >= 1, got {start}")
    good, bad = 0, None
    bs = start
    while bs <= limit:
        if not fits(bs):
            bad = bs
            break
        good, bs = bs, bs * 2
    if good == 0 or bad is None:
        return good
    while bad - good > (GRAIN if good >= GRAIN else 1):
        mid = (good + bad) // 2
        if mid >= GRAIN:
            mid -= mid % GRAIN
        if mid <= good:
            break
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def model_step(
    model: str | nn.Module,
    size: int,
    batch_sizes: Sequence[int],
    pipeline_rate: float,
    steps: int = 10,
    device: str | torch.device = "cuda",
    limit: int = LIMIT,
    reserve: Callable[[int], int] | None = None,
) -> dict:
    """Times a bf16 channels_last SGD step of ``model`` (a name, or a module) at the
    largest of ``batch_sizes`` that fits, after finding the largest batch that fits at all
    beside ``reserve(batch_size)`` bytes (default: :func:`loader_device_bytes`).

    Raises:
        ValueError: Not even the smallest of ``batch_sizes`` fits.
    """
    device = torch.device(device)
    name = model if isinstance(model, str) else type(model).__name__
    net = (create_model(model) if isinstance(model, str) else model).to(device).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step(bs: int) -> None:
        x = torch.randn(bs, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = net(x)
            loss = loss_fn(out, torch.randint(0, out.shape[1], (bs,), device=device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    held = reserve or (lambda bs: loader_device_bytes(bs, size))

    def fits(bs: int) -> bool:
        return try_batch(step, bs, lambda: opt.zero_grad(set_to_none=True), device, held(bs))

    largest = largest_batch(fits, min(batch_sizes), limit)
    if largest == 0:
        raise ValueError(f"{name} does not fit even batch size {min(batch_sizes)}")
    chosen = max([b for b in batch_sizes if b <= largest] or [largest])
    step(chosen)
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step(chosen)
    sync(device)
    rate = steps * chosen / (time.perf_counter() - start)
    return {
        "name": name,
        "batch_size": chosen,
        "samples_per_s": rate,
        "max_batch_size": largest,
        "input_bound": pipeline_rate < rate,
    }
