"""timm's auto-augment strings, parsed with timm's meaning (timm 1.0 ``timm/data/auto_augment.py``).

What users type in timm's ``--aa``: ``rand-m9-mstd0.5-inc1`` (RandAugment), ``augmix-m5-w4-d2``
(AugMix), or an AutoAugment policy name (``original``, ``originalr``, ``v0``, ``v0r``, ``3a``)
with an optional ``-mstd<x>``. Sections are dash-separated; a numeric section is a key followed
by its value (``m9``, ``mstd0.5``), split at the first digit as timm does, so a section with no
digit (``rand-foo``) is ignored as timm ignores it. Unknown keys, which timm rejects with an
``assert``, are a ValueError here naming the section.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

AUTO_AUGMENT_POLICIES = ("3a", "original", "originalr", "v0", "v0r")
# timm's 't' choices besides the default op lists: weighted sets and the 3-Augment list.
RAND_CHOICES = ("3a", "3aw", "weights")


@dataclass(frozen=True)
class RandConfig:
    """``rand-…``: RandAugment.

    Attributes:
        magnitude: ``m``: the op level, 0–10 on timm's scale (default 10).
        num_layers: ``n``: ops applied per image (default 2).
        prob: ``p``: probability each chosen op is applied (default 0.5).
        magnitude_std: ``mstd``: std of gaussian noise on the magnitude per op call; inf
            (timm: any value > 100) draws it uniformly in [0, magnitude] (default 0).
        magnitude_max: ``mmax``: clip the magnitude to [0, mmax] instead of [0, 10].
        increasing: ``inc1``: the op variants whose severity increases with magnitude.
        choices: ``t<name>``: ``weights``, ``3aw`` (weighted, drawn without replacement)
            or ``3a``; None: timm's default list.
    """

    magnitude: float = 10
    num_layers: int = 2
    prob: float = 0.5
    magnitude_std: float = 0.0
    magnitude_max: float | None = None
    increasing: bool = False
    choices: str | None = None


@dataclass(frozen=True)
class AugMixConfig:
    """``augmix-…``: AugMix.

    Attributes:
        magnitude: ``m``: severity (default 3).
        width: ``w``: augmentation chains mixed (default 3).
        depth: ``d``: ops per chain; -1 draws 1–3 per chain (default -1).
        alpha: ``a``: Dirichlet and Beta concentration (default 1).
        blended: ``b1``: timm's blended mode (one blend per chain, no final blend).
        magnitude_std: ``mstd``: magnitude noise; timm's AugMix default is inf (uniform).
    """

    magnitude: float = 3
    width: int = 3
    depth: int = -1
    alpha: float = 1.0
    blended: bool = False
    magnitude_std: float = math.inf


@dataclass(frozen=True)
class AutoConfig:
    """An AutoAugment policy: ``original``, ``originalr``, ``v0``, ``v0r`` or ``3a``.

    Attributes:
        policy: The policy name.
        magnitude_std: ``mstd``: magnitude noise (default 0).
    """

    policy: str = "v0"
    magnitude_std: float = 0.0


AugmentConfig = RandConfig | AugMixConfig | AutoConfig


def _sections(config_str: str) -> tuple[str, list[tuple[str, str, str]]]:
    """The head and, for each later section, (section, key, value). timm drops a section
    without a number silently; here it is an error naming it (RandAugment's op-set
    sections, ``t…``, are read by their parser)."""
    head, *rest = config_str.split("-")
    out = []
    for section in rest:
        parts = re.split(r"(\d.*)", section)
        if len(parts) >= 2:
            out.append((section, parts[0], parts[1]))
        elif not (head == "rand" and section.startswith("t")):
            raise ValueError(
                f"auto-augment section {section!r} of {config_str!r} has no number: expected e.g. "
                "'m9', 'n2', 'mstd0.5' (timm's grammar)"
            )
    return head, out


def _number(section: str, value: str, kind: type) -> float:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"auto-augment section {section!r}: {value!r} is not a valid {kind.__name__}") from None


def _unknown(config_str: str, section: str, what: str) -> ValueError:
    return ValueError(f"unknown {what} section {section!r} in auto-augment string {config_str!r}")


def _parse_rand(config_str: str) -> RandConfig:
    fields: dict = {}
    for section in config_str.split("-")[1:]:
        # 't…' is tested first, as timm does: 'tweights', 't3a' name the op set.
        if section.startswith("t"):
            if section[1:] not in RAND_CHOICES:
                raise ValueError(f"auto-augment section {section!r}: op set must be one of {RAND_CHOICES}")
            fields.setdefault("choices", section[1:])
    for section, key, val in _sections(config_str)[1]:
        if section.startswith("t"):
            continue
        if key == "mstd":
            mstd = _number(section, val, float)
            fields["magnitude_std"] = math.inf if mstd > 100 else mstd
        elif key == "mmax":
            fields["magnitude_max"] = _number(section, val, int)
        elif key == "inc":
            fields["increasing"] = bool(_number(section, val, int))
        elif key == "m":
            fields["magnitude"] = _number(section, val, int)
        elif key == "n":
            fields["num_layers"] = _number(section, val, int)
        elif key == "p":
            fields["prob"] = _number(section, val, float)
        else:
            raise _unknown(config_str, section, "RandAugment")
    return RandConfig(**fields)


def _parse_augmix(config_str: str) -> AugMixConfig:
    fields: dict = {}
    keys = {
        "m": ("magnitude", int),
        "w": ("width", int),
        "d": ("depth", int),
        "a": ("alpha", float),
        "mstd": ("magnitude_std", float),
    }
    for section, key, val in _sections(config_str)[1]:
        if key == "b":
            fields["blended"] = bool(_number(section, val, int))
        elif key in keys:
            name, kind = keys[key]
            fields[name] = _number(section, val, kind)
        else:
            raise _unknown(config_str, section, "AugMix")
    return AugMixConfig(**fields)


def _parse_auto(config_str: str) -> AutoConfig:
    head, sections = _sections(config_str)
    if head not in AUTO_AUGMENT_POLICIES:
        raise ValueError(
            f"unknown auto-augment {config_str!r}: expected 'rand-…', 'augmix-…' or one of the "
            f"AutoAugment policies {AUTO_AUGMENT_POLICIES} (timm's names)"
        )
    mstd = 0.0
    for section, key, val in sections:
        if key != "mstd":
            raise _unknown(config_str, section, "AutoAugment")
        mstd = _number(section, val, float)
    return AutoConfig(head, mstd)


def parse_auto_augment(config_str: str) -> AugmentConfig:
    """Parses a timm auto-augment string (see the module docstring).

    Args:
        config_str: e.g. ``"rand-m9-mstd0.5-inc1"``, ``"augmix-m5-w4-d2"``, ``"original"``.

    Returns:
        A :class:`RandConfig`, :class:`AugMixConfig` or :class:`AutoConfig`.

    Raises:
        ValueError: An unknown policy or section, or a malformed number.
    """
    if not isinstance(config_str, str) or not config_str:
        raise TypeError(f"auto_augment must be a non-empty string, got {config_str!r}")
    head = config_str.split("-")[0]
    if head == "rand":
        return _parse_rand(config_str)
    if head == "augmix":
        return _parse_augmix(config_str)
    return _parse_auto(config_str)
