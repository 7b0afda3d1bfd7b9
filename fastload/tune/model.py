"""``fastload tune --model``: a model's training step rate and largest batch on CUDA."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn as nn


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


def model_step(name: str, size: int, batch_sizes: Sequence[int], pipeline_rate: float, steps: int = 10) -> dict:
    """Times a bf16 channels_last SGD step; finds the largest batch that fits by doubling."""
    device = torch.device("cuda")
    net = create_model(name).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step(bs: int) -> None:
        x = torch.randn(bs, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (bs,), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def fits(bs: int) -> bool:
        try:
            step(bs)
            torch.cuda.synchronize()
            return True
        except torch.cuda.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            return False

    largest, bs = 0, min(batch_sizes)
    while bs <= 16384 and fits(bs):
        largest, bs = bs, bs * 2
    if largest == 0:
        raise ValueError(f"{name} does not fit even batch size {min(batch_sizes)}")
    chosen = max([b for b in batch_sizes if b <= largest] or [largest])
    step(chosen)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(chosen)
    torch.cuda.synchronize()
    rate = steps * chosen / (time.perf_counter() - start)
    return {"name": name, "batch_size": chosen, "samples_per_s": rate, "max_batch_size": largest,
            "input_bound": pipeline_rate < rate}
