"""timm's AugMix (``AugMixAugment``): chains of random ops mixed by Dirichlet weights.

``width`` chains of ``depth`` ops (1–3 drawn per chain when ``depth`` is -1), each op drawn
with replacement, are mixed with Dirichlet(alpha) weights, and the mix is blended with the
original by m ~ Beta(alpha, alpha), in float32 and truncated as timm does (its ``np.asarray``
accumulation, ``astype(uint8)`` and Pillow's ``Image.blend``). ``blended=True`` is timm's
faster variant: one blend per chain with weights rescaled so the result needs no final blend.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .settings import Settings


def _blend(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    """Pillow's ``Image.blend(a, b, alpha)``: a + alpha (b - a) in float32, clipped, truncated."""
    fa = a.astype(np.float32)
    out = fa + np.float32(alpha) * (b.astype(np.float32) - fa)
    return np.clip(out, 0, 255, out=out).astype(np.uint8)


class TimmAugMix(Settings):
    """timm's AugMix on uint8 H×W×C arrays.

    Args:
        ops: The candidate ops, each ``f(img, rng) -> img`` (timm's AugMix ops have prob 1).
        alpha: Concentration of the Dirichlet chain weights and of the Beta blend.
        width: Number of chains.
        depth: Ops per chain; -1 draws 1–3 per chain.
        blended: timm's blended mode.
    """

    def __init__(
        self, ops: Sequence[Callable], alpha: float = 1.0, width: int = 3, depth: int = -1, blended: bool = False
    ) -> None:
        self.ops = list(ops)
        if not self.ops:
            raise ValueError("ops must not be empty")
        if not alpha > 0 or not math.isfinite(alpha):
            raise ValueError(f"alpha must be > 0 and finite, got {alpha!r}")
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
            raise ValueError(f"width must be an int >= 1, got {width!r}")
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth == 0 or depth < -1:
            raise ValueError(f"depth must be >= 1, or -1 for a random 1-3, got {depth!r}")
        self.alpha, self.width, self.depth, self.blended = float(alpha), int(width), int(depth), bool(blended)

    def _chain(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        depth = self.depth if self.depth > 0 else int(rng.integers(1, 4))
        for i in rng.integers(len(self.ops), size=depth).tolist():
            img = self.ops[i](img, rng)
        return img

    @staticmethod
    def blended_weights(ws: np.ndarray, m: float) -> np.ndarray:
        """timm's per-chain blend weights: applied in order, they give the chains
        ``ws * m`` of the result (and the original the rest)."""
        ws = ws * m
        cump, out = 1.0, []
        for w in ws[::-1]:
            a = w / cump
            cump *= 1 - a
            out.append(a)
        return np.array(out[::-1], dtype=np.float32)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        weights = rng.dirichlet([self.alpha] * self.width).astype(np.float32)
        m = np.float32(rng.beta(self.alpha, self.alpha))
        return self.mix(img, weights, float(m), rng)

    def mix(self, img: np.ndarray, weights: np.ndarray, m: float, rng: np.random.Generator) -> np.ndarray:
        """The mix for given chain ``weights`` and blend ``m`` (the chains' ops drawn from ``rng``)."""
        if self.blended:
            out = img
            for w in self.blended_weights(weights, m):
                out = _blend(out, self._chain(img, rng), float(w))
            return out
        mixed = np.zeros(img.shape, dtype=np.float32)
        for w in weights:
            mixed += w * self._chain(img, rng).astype(np.float32)
        np.clip(mixed, 0, 255, out=mixed)
        return _blend(img, mixed.astype(np.uint8), float(m))

    def __repr__(self) -> str:
        return f"TimmAugMix(alpha={self.alpha}, width={self.width}, depth={self.depth}, blended={self.blended})"
