"""Random draws on the generator's own device, vectorised and without a host sync.

A batch augmentation runs where the batch is (the GPU when there is one). Drawing its
parameters there with the batch's ``torch.Generator`` keeps every draw reproducible from
(seed, epoch, batch) and never makes the host wait for the device: no ``.item()``, no
data-dependent shapes. torch has no Beta or Gamma sampler that takes a generator, so
:func:`beta` is built here from normals and uniforms.
"""

from __future__ import annotations

import math

import torch

# Marsaglia–Tsang candidates per Gamma draw: each is accepted with probability >= 0.95
# (shape >= 1), so all 16 fail with probability < 1e-20 (the draw then falls back to the mode).
_ROUNDS = 16


def uniform(shape: tuple[int, ...], generator: torch.Generator, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """float64 draws in [low, high) on the generator's device."""
    u = torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float64)
    return u if (low, high) == (0.0, 1.0) else u.mul_(high - low).add_(low)


def integers(
    low: torch.Tensor | int, high: torch.Tensor | int, shape: tuple[int, ...], generator: torch.Generator
) -> torch.Tensor:
    """int64 draws in [low, high) (bounds may differ per element; high > low).

    Python bounds stay Python numbers: a tensor made from them on a GPU would be a copy
    from pageable memory, which torch makes the host wait for.
    """
    span = high - low
    drawn = (uniform(shape, generator) * span).floor_().long()
    # u · span rounds up to span only when u is 1 - 2**-53: keep the draw below it.
    drawn = torch.minimum(drawn, span - 1) if isinstance(span, torch.Tensor) else drawn.clamp_(max=span - 1)
    return drawn + low


def _log_gamma(shape_param: float, size: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """log of Gamma(shape_param, 1) draws, float64.

    Marsaglia and Tsang's method on shape + 1 (always >= 1), boosted to ``shape`` by
    ``U ** (1 / shape)``: in log space, so small shapes (mixup's 0.1–0.4) never underflow.
    """
    d = shape_param + 1.0 - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    device = generator.device
    x = torch.randn(size + (_ROUNDS,), generator=generator, device=device, dtype=torch.float64)
    u = torch.rand(size + (_ROUNDS,), generator=generator, device=device, dtype=torch.float64)
    v = (1.0 + c * x) ** 3
    positive = v > 0
    log_v = torch.log(torch.where(positive, v, 1.0))
    accepted = positive & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
    first = accepted.to(torch.uint8).argmax(dim=-1, keepdim=True)  # the first accepted candidate
    log_v = torch.where(accepted.any(dim=-1), log_v.gather(-1, first).squeeze(-1), 0.0)
    boost = torch.rand(size, generator=generator, device=device, dtype=torch.float64)
    boost = torch.log1p(-boost) / shape_param  # log(U) / shape, U = 1 - rand in (0, 1]
    return math.log(d) + log_v + boost


def beta(alpha: float, size: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Beta(alpha, alpha) draws, float64: X / (X + Y) for X, Y ~ Gamma(alpha), as a sigmoid
    of their log difference (exact at the extremes, where X + Y would underflow)."""
    return torch.sigmoid(_log_gamma(alpha, size, generator) - _log_gamma(alpha, size, generator))


def normal_like(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """N(0, 1) noise with the shape, dtype, device and memory format of ``images``; drawn
    where the images are (from a generator seeded from ``generator`` if that is elsewhere:
    a whole batch of noise is too much to draw on the host and copy)."""
    if generator.device != images.device:
        seed = torch.randint(0, 2**62, (), generator=generator, device=generator.device, dtype=torch.int64)
        generator = on_device(images.device).manual_seed(int(seed))  # no device wait from a CPU generator
    noise = torch.empty_like(images, dtype=torch.float32)
    noise.normal_(generator=generator)
    return noise.to(images.dtype)


def fresh_generator(device: torch.device) -> torch.Generator:
    """A generator on ``device`` (else the CPU) seeded from torch's default CPU generator:
    what a batch transform called without one draws from (``torch.manual_seed`` sets it)."""
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())  # the host's generator: no device sync
    return on_device(device).manual_seed(seed)


def on_device(device: torch.device) -> torch.Generator:
    """An unseeded generator on ``device`` where torch has one there, else on the CPU."""
    try:
        return torch.Generator(device=device)
    except RuntimeError:
        return torch.Generator()
