"""timm's RandAugment, AutoAugment and AugMix, drawing from the sample's ``rng``.

The same op lists, weights, magnitude noise and per-op probabilities as timm 1.0
(``timm/data/auto_augment.py``), on the PIL-equivalent ops of :mod:`.timm_ops`. The
draws follow timm's distributions, not its random sequence: timm draws from Python's and
numpy's global generators, these from the generator fastload derives from (seed, epoch,
sample index), so a sample's augmentation does not depend on which worker ran it.
Build one from a string with :func:`timm_augment`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .functional._utils import finite
from .settings import Settings
from .timm_augmix import TimmAugMix
from .timm_config import AugMixConfig, AutoConfig, RandConfig, parse_auto_augment
from .timm_levels import (
    AUGMIX_TRANSFORMS,
    LEVEL_DENOM,
    OPS,
    RAND_3A,
    RAND_INCREASING_TRANSFORMS,
    RAND_TRANSFORMS,
    RAND_WEIGHTED_0,
    RAND_WEIGHTED_3A,
    Hparams,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)


class TimmOp(Settings):
    """timm's ``AugmentOp``: applied with probability ``prob`` at a (noisy) magnitude.

    Args:
        name: An op of timm's table (``"Rotate"``, ``"SolarizeIncreasing"``, …).
        prob: Probability the op is applied.
        magnitude: Level on the 0–10 scale.
        hparams: Translation sizes, fill and interpolation.
        magnitude_std: Gaussian noise on the magnitude per call; inf: uniform in [0, magnitude].
        magnitude_max: Upper clip of the magnitude (default 10).
    """

    def __init__(
        self,
        name: str,
        prob: float = 0.5,
        magnitude: float = 10,
        hparams: Hparams | None = None,
        magnitude_std: float = 0.0,
        magnitude_max: float | None = None,
    ) -> None:
        if name not in OPS:
            raise ValueError(f"unknown timm op {name!r}; known: {sorted(OPS)}")
        if not 0 <= prob <= 1:
            raise ValueError(f"prob must be in [0, 1], got {prob!r}")
        finite("magnitude", magnitude)
        finite("magnitude_max", magnitude_max)
        if math.isnan(magnitude_std) or magnitude_std == -math.inf:  # +inf is timm's uniform draw
            raise ValueError(f"magnitude_std must be a number or inf (uniform), got {magnitude_std!r}")
        self.name, self.prob, self.magnitude = name, float(prob), float(magnitude)
        self.hparams = hparams or Hparams()
        self.magnitude_std, self.magnitude_max = float(magnitude_std), magnitude_max
        self._spec = OPS[name]

    def draw_magnitude(self, rng: np.random.Generator) -> float:
        """The magnitude of one call: noise, then the clip to [0, magnitude_max or 10]."""
        m = self.magnitude
        if self.magnitude_std == math.inf:
            m = rng.uniform(0, m)
        elif self.magnitude_std > 0:
            m = rng.normal(m, self.magnitude_std)
        return max(0.0, min(m, self.magnitude_max or LEVEL_DENOM))

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.prob < 1.0 and rng.random() > self.prob:
            return img
        args = self._spec.level_to_arg(self.draw_magnitude(rng), self.hparams, rng)
        return self._spec.apply(img, *args, self.hparams, rng)

    def __repr__(self) -> str:
        return f"TimmOp({self.name}, p={self.prob}, m={self.magnitude}, mstd={self.magnitude_std}" + (
            f", mmax={self.magnitude_max})" if self.magnitude_max is not None else ")"
        )


class TimmRandAugment(Settings):
    """timm's ``RandAugment``: ``num_layers`` ops drawn per image, with replacement, or by
    weight without replacement when ``weights`` is given (as timm's ``np.random.choice``).

    Args:
        ops: The candidate ops.
        num_layers: Ops applied per image.
        weights: Choice weights (normalised here), or None for a uniform choice.
    """

    def __init__(self, ops: Sequence[TimmOp], num_layers: int = 2, weights: Sequence[float] | None = None) -> None:
        self.ops = list(ops)
        if not self.ops:
            raise ValueError("ops must not be empty")
        if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or num_layers < 0:
            raise ValueError(f"num_layers must be an int >= 0, got {num_layers!r}")
        self.num_layers = int(num_layers)
        self.weights = None
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (len(self.ops),) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
                raise ValueError(f"weights must be {len(self.ops)} non-negative finite numbers, got {weights!r}")
            if num_layers > np.count_nonzero(w):
                raise ValueError(f"num_layers={num_layers} exceeds the ops with non-zero weight")
            self.weights = w / w.sum()

    def choose(self, rng: np.random.Generator) -> list[int]:
        """The indices of the ops one image gets, in order."""
        return rng.choice(len(self.ops), self.num_layers, replace=self.weights is None, p=self.weights).tolist()

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        for i in self.choose(rng):
            img = self.ops[i](img, rng)
        return img

    def __repr__(self) -> str:
        return f"TimmRandAugment(n={self.num_layers}, ops=[{', '.join(op.name for op in self.ops)}])"


_V0 = [
    [("Equalize", 0.8, 1), ("ShearY", 0.8, 4)],
    [("Color", 0.4, 9), ("Equalize", 0.6, 3)],
    [("Color", 0.4, 1), ("Rotate", 0.6, 8)],
    [("Solarize", 0.8, 3), ("Equalize", 0.4, 7)],
    [("Solarize", 0.4, 2), ("Solarize", 0.6, 2)],
    [("Color", 0.2, 0), ("Equalize", 0.8, 8)],
    [("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)],
    [("ShearX", 0.2, 9), ("Rotate", 0.6, 8)],
    [("Color", 0.6, 1), ("Equalize", 1.0, 2)],
    [("Invert", 0.4, 9), ("Rotate", 0.6, 0)],
    [("Equalize", 1.0, 9), ("ShearY", 0.6, 3)],
    [("Color", 0.4, 7), ("Equalize", 0.6, 0)],
    [("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)],
    [("Solarize", 0.6, 8), ("Color", 0.6, 9)],
    [("Solarize", 0.2, 4), ("Rotate", 0.8, 9)],
    [("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)],
    [("ShearX", 0.0, 0), ("Solarize", 0.8, 4)],
    [("ShearY", 0.8, 0), ("Color", 0.6, 4)],
    [("Color", 1.0, 0), ("Rotate", 0.6, 2)],
    [("Equalize", 0.8, 4), ("Equalize", 0.0, 8)],
    [("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)],
    [("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)],
    [("Posterize", 0.8, 2), ("Solarize", 0.6, 10)],
    [("Solarize", 0.6, 8), ("Equalize", 0.6, 1)],
    [("Color", 0.8, 6), ("Rotate", 0.4, 5)],
]
_ORIGINAL = [
    [("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)],
    [("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)],
    [("Equalize", 0.8, 8), ("Equalize", 0.6, 3)],
    [("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)],
    [("Equalize", 0.4, 7), ("Solarize", 0.2, 4)],
    [("Equalize", 0.4, 4), ("Rotate", 0.8, 8)],
    [("Solarize", 0.6, 3), ("Equalize", 0.6, 7)],
    [("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)],
    [("Rotate", 0.2, 3), ("Solarize", 0.6, 8)],
    [("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)],
    [("Rotate", 0.8, 8), ("Color", 0.4, 0)],
    [("Rotate", 0.4, 9), ("Equalize", 0.6, 2)],
    [("Equalize", 0.0, 7), ("Equalize", 0.8, 8)],
    [("Invert", 0.6, 4), ("Equalize", 1.0, 8)],
    [("Color", 0.6, 4), ("Contrast", 1.0, 8)],
    [("Rotate", 0.8, 8), ("Color", 1.0, 2)],
    [("Color", 0.8, 8), ("Solarize", 0.8, 7)],
    [("Sharpness", 0.4, 7), ("Invert", 0.6, 8)],
    [("ShearX", 0.6, 5), ("Equalize", 1.0, 9)],
    [("Color", 0.4, 0), ("Equalize", 0.6, 3)],
    [("Equalize", 0.4, 7), ("Solarize", 0.2, 4)],
    [("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)],
    [("Invert", 0.6, 4), ("Equalize", 1.0, 8)],
    [("Color", 0.6, 4), ("Contrast", 1.0, 8)],
    [("Equalize", 0.8, 8), ("Equalize", 0.6, 3)],
]


def _renamed(policy: list, old: str, new: str) -> list:
    return [[(new if name == old else name, p, m) for name, p, m in sub] for sub in policy]


# The "r" variants use the research Posterize (bits removed grow with the magnitude).
POLICIES = {
    "v0": _V0,
    "v0r": _renamed(_V0, "Posterize", "PosterizeIncreasing"),
    "original": _ORIGINAL,
    "originalr": _renamed(_ORIGINAL, "PosterizeOriginal", "PosterizeIncreasing"),
    "3a": [[("Solarize", 1.0, 5)], [("Desaturate", 1.0, 10)], [("GaussianBlurRand", 1.0, 10)]],
}


class TimmAutoAugment(Settings):
    """timm's ``AutoAugment``: one sub-policy drawn uniformly per image, its ops applied in order.

    Args:
        policy: Sub-policies, each a list of ops.
    """

    def __init__(self, policy: Sequence[Sequence[TimmOp]]) -> None:
        self.policy = [list(sub) for sub in policy]
        if not self.policy:
            raise ValueError("policy must not be empty")

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        for op in self.policy[int(rng.integers(len(self.policy)))]:
            img = op(img, rng)
        return img

    def __repr__(self) -> str:
        return f"TimmAutoAugment({len(self.policy)} sub-policies)"


def _hparams(
    img_size: int | Sequence[int], mean: Sequence[float], interpolation: str, translate_pct: float = 0.45
) -> Hparams:
    # As timm's transforms_imagenet_train builds its aa_params.
    size = img_size if isinstance(img_size, int) else min(img_size)
    fill = tuple(min(255, round(255 * x)) for x in mean)
    return Hparams(int(size * 0.45), translate_pct, fill, interpolation)


def timm_augment(
    config_str: str,
    img_size: int | Sequence[int] = 224,
    mean: Sequence[float] = IMAGENET_MEAN,
    interpolation: str = "random",
):
    """The transform timm's ``transforms_imagenet_train`` builds for ``auto_augment=config_str``.

    Args:
        config_str: timm's string: ``"rand-m9-mstd0.5-inc1"``, ``"augmix-m5-w4-d2"``,
            ``"original"``, ``"v0r-mstd0.5"``, … (:func:`~.timm_config.parse_auto_augment`).
        img_size: The crop size: translations are 45% of it at level 10, as in timm.
        mean: The normalisation mean: the fill of uncovered pixels is ``round(255 * mean)``.
        interpolation: Of the geometric ops: ``"bilinear"``, ``"bicubic"`` or ``"random"``.

    Returns:
        A :class:`TimmRandAugment`, :class:`TimmAutoAugment` or
        :class:`~.timm_augmix.TimmAugMix`, called ``f(img, rng)``.
    """
    cfg = parse_auto_augment(config_str)
    if isinstance(cfg, AugMixConfig):
        hp = _hparams(img_size, mean, interpolation, translate_pct=0.3)
        ops = [TimmOp(n, 1.0, cfg.magnitude, hp, cfg.magnitude_std) for n in AUGMIX_TRANSFORMS]
        return TimmAugMix(ops, cfg.alpha, cfg.width, cfg.depth, cfg.blended)
    hp = _hparams(img_size, mean, interpolation)
    if isinstance(cfg, AutoConfig):
        return TimmAutoAugment(
            [[TimmOp(n, p, m, hp, cfg.magnitude_std) for n, p, m in sub] for sub in POLICIES[cfg.policy]]
        )
    assert isinstance(cfg, RandConfig)
    names, weights = _rand_choices(cfg)
    ops = [TimmOp(n, cfg.prob, cfg.magnitude, hp, cfg.magnitude_std, cfg.magnitude_max) for n in names]
    return TimmRandAugment(ops, cfg.num_layers, weights)


def _rand_choices(cfg: RandConfig) -> tuple[Sequence[str], Sequence[float] | None]:
    if cfg.choices == "weights":
        return tuple(RAND_WEIGHTED_0), tuple(RAND_WEIGHTED_0.values())
    if cfg.choices == "3aw":
        return tuple(RAND_WEIGHTED_3A), tuple(RAND_WEIGHTED_3A.values())
    if cfg.choices == "3a":
        return RAND_3A, None
    return (RAND_INCREASING_TRANSFORMS if cfg.increasing else RAND_TRANSFORMS), None
