"""Choosing the finalists from the search's runs, and spotting a busy machine.

The search measures each configuration once; its best few are run once more
(:func:`runoff`). The two leaders by the median of those runs that a saved profile would
tell apart are the finalists that :mod:`.decide` then runs again, interleaved; and a curve
that dips and rises again with more workers is flagged, since a CPU-bound loader does not
draw one on a quiet machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from ..loading.profiles import APPLIED
from .search import DIMENSIONS, Config

#: A change in rate larger than this (relative) counts as a dip or a gain.
STEADY = 0.10

#: How many configurations are run again before the finalists are chosen: the best of each
#: profile (:func:`applied`), best first.
RUNOFF = 4


def _key(config: Config) -> tuple:
    return tuple(config[d] for d in DIMENSIONS)


def runoff(
    results: Sequence[tuple[Config, float]], measure: Callable[[Config], float], size: int = RUNOFF
) -> list[tuple[Config, float]]:
    """The best configuration of each of the ``size`` best profiles (:func:`applied`: what a
    saved profile holds) by their single search runs, each run once more, and their medians:
    what the finalists are chosen from.

    One run is not enough to rank them on a machine shared with other jobs (a configuration
    run nine times in one tuner run measured 386 to 1,175 samples/s), and the search runs
    them in a fixed order (batch sizes and workers ascending), so a machine that grows
    busier during the search favours the ones it ran first. The second runs go in the
    reverse of the search's order, so such a drift weighs on the pair of runs of each alike.
    One configuration per profile: the finalists must be profiles that differ, and two batch
    sizes of one profile would take two places (in one run 0 workers took two of the four,
    and no 2-worker configuration was run again).

    Args:
        results: The search's (configuration, samples/s), in the order it ran them.
        measure: Runs one configuration and returns its samples/s.
        size: How many profiles' best configurations to run again (at least 1).

    Returns:
        (configuration, median of its runs), best first.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    best: dict[tuple, Config] = {}  # each profile's best configuration, best profile first
    for c, _ in sorted(results, key=lambda r: r[1], reverse=True):
        best.setdefault(applied(c), c)
    top = {_key(c) for c in list(best.values())[:size]}
    runs = {_key(c): [rate] for c, rate in results if _key(c) in top}
    again = [c for c, _ in results if _key(c) in top][::-1]
    for c in again:
        runs[_key(c)].append(measure(c))
    return sorted(((c, statistics.median(runs[_key(c)])) for c in reversed(again)), key=lambda r: r[1], reverse=True)


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
            if r1 < r0 * (1 - margin) and max(r for _, r in points[i + 1 :]) > r0 * (1 + margin):
                found.append(
                    f"batch {rest[0]}, {rest[2]} backend: {w1} workers measured {r1:.0f} samples/s, "
                    f"below {w0} workers' {r0:.0f}, and more workers then gained again: "
                    "the machine is likely busy"
                )
                break
    return found
