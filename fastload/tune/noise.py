"""Whether the tuner's winner stands out from noise: repeated measurements of the leaders.

One measurement per configuration is cheap but, on a machine shared with other jobs, a
lucky window can make a poor configuration look best (0 workers once won on a busy
machine, and the saved profile then made every Loader on that folder single-process).
So the two leading configurations that a profile would tell apart are measured again,
alternately, and the winner is saved only when its range of rates lies above the
runner-up's, or when both are steady and equal (either is then as good).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..loading.profiles import APPLIED
from .search import DIMENSIONS, Config

#: Relative spread (max - min) / median under which a configuration's rate counts as steady.
STEADY = 0.10
#: Medians closer than this (relative) are a tie when both are steady.
TIE = 0.05


def key(config: Config) -> tuple:
    return tuple(config[d] for d in DIMENSIONS)


@dataclass(frozen=True)
class Spread:
    """The repeated rates (samples/s) of one configuration."""

    config: Config
    rates: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def low(self) -> float:
        return min(self.rates)

    @property
    def high(self) -> float:
        return max(self.rates)

    @property
    def relative(self) -> float:
        """(max - min) / median: 0 for one measurement or a steady rate."""
        return (self.high - self.low) / self.median if self.median else float("inf")

    def describe(self) -> str:
        c = self.config
        return (f"batch {c['batch_size']}, {c['num_workers']} workers, prefetch {c['prefetch_factor']}, "
                f"{c['backend']}: {self.median:.0f} samples/s (range {self.low:.0f}-{self.high:.0f} over "
                f"{len(self.rates)} runs, spread {self.relative:.0%})")

    def as_dict(self) -> dict:
        return {**self.config, "rates": list(self.rates), "median": self.median, "low": self.low,
                "high": self.high, "spread": self.relative}


@dataclass(frozen=True)
class Verdict:
    """The winner after repeated measurement, and whether noise could have chosen it."""

    winner: Spread
    runner_up: Spread | None
    dips: tuple[str, ...] = ()

    @property
    def separable(self) -> bool:
        """The winner's every rate is above the runner-up's every rate."""
        return self.runner_up is None or self.winner.low > self.runner_up.high

    @property
    def tie(self) -> bool:
        """Overlapping, but both steady and within TIE of each other: equally good."""
        r = self.runner_up
        return (r is not None and not self.separable and max(self.winner.relative, r.relative) <= STEADY
                and self.winner.median <= r.median * (1 + TIE))

    @property
    def saveable(self) -> bool:
        return self.separable or self.tie

    def advice(self, command: str) -> str:
        """Why the winner is (not) trustworthy, and what to do."""
        if self.runner_up is None:
            return f"only one configuration was measured: {self.winner.describe()}"
        lines = [f"winner     {self.winner.describe()}", f"runner-up  {self.runner_up.describe()}"]
        if self.separable:
            lines.append("the winner's slowest run beats the runner-up's fastest: the choice is not noise")
        elif self.tie:
            lines.append("the two are steady and within 5% of each other: either is as good")
        else:
            lines.append("noise cannot separate them (their ranges overlap and the runs are unsteady: other jobs "
                         "on this machine?). Re-run when the machine is quieter, or measure longer: "
                         f"{command} --seconds 10 --repeats 5")
        lines += [f"warning: {d}" for d in self.dips]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"winner": self.winner.as_dict(),
                "runner_up": self.runner_up.as_dict() if self.runner_up is not None else None,
                "separable": self.separable, "tie": self.tie, "saveable": self.saveable, "dips": list(self.dips)}


def applied(config: Config) -> tuple:
    """What a saved profile would take from ``config`` (two configs equal here are one profile)."""
    return tuple(config[k] for k in APPLIED)


def leaders(results: Sequence[tuple[Config, float]]) -> list[Config]:
    """The best configuration, and the best one whose profile would differ, by first measurement."""
    ranked = sorted(results, key=lambda r: r[1], reverse=True)
    if not ranked:
        return []
    best = ranked[0][0]
    other = next((c for c, _ in ranked if applied(c) != applied(best)), None)
    return [best] if other is None else [best, other]


def confirm(results: Sequence[tuple[Config, float]], measure: Callable[[Config], float], repeats: int) -> Verdict:
    """Measures the leaders of ``results`` until each has ``repeats`` rates, alternating
    between them so that drift on the machine hits both alike."""
    if repeats < 2:
        raise ValueError(f"--repeats must be >= 2 (one run cannot show its noise), got {repeats}")
    first = {key(c): rate for c, rate in results}
    tops = leaders(results)
    rates = {key(c): [first[key(c)]] for c in tops}
    for _ in range(repeats - 1):
        for c in tops:
            rates[key(c)].append(measure(c))
    spreads = sorted((Spread(dict(c), tuple(rates[key(c)])) for c in tops), key=lambda s: s.median, reverse=True)
    return Verdict(spreads[0], spreads[1] if len(spreads) > 1 else None, tuple(dips(results)))


def dips(results: Sequence[tuple[Config, float]], margin: float = STEADY) -> list[str]:
    """Where adding workers first lost and then gained more than ``margin``: a curve a
    CPU-bound loader does not have on a quiet machine, so the measurements are suspect."""
    series: dict[tuple, list[tuple[int, float]]] = {}
    for c, rate in results:
        if c["num_workers"] > 0:
            rest = tuple(c[d] for d in DIMENSIONS if d != "num_workers")
            series.setdefault(rest, []).append((c["num_workers"], rate))
    found = []
    for rest, points in series.items():
        points.sort()
        for i in range(1, len(points) - 1):
            (w0, r0), (w1, r1) = points[i - 1], points[i]
            if r1 < r0 * (1 - margin) and max(r for _, r in points[i + 1:]) > r0 * (1 + margin):
                found.append(f"batch {rest[0]}, {rest[2]} backend: {w1} workers measured {r1:.0f} samples/s, "
                             f"below {w0} workers' {r0:.0f}, and more workers then gained again: "
                             "the machine is likely busy")
                break
    return found
