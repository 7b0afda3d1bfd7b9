"""Telling the tuner's two finalists apart on a noisy machine, within a time budget.

One run per configuration is enough to find the finalists, not to choose between them: on
a machine shared with other jobs a run can be off by half. So the finalists A and B (and
PyTorch's default C, when it is neither, for the speed-up the report states) are run again
in rounds ordered ``A B [C] B A``. The order is a palindrome, so a machine that speeds up or
slows down steadily during a round hits each configuration alike (ABBA). Each round gives
two adjacent A/B pairs, and the log of each pair's ratio is one sample of how much faster A
is. After the first ``min_rounds`` rounds the tuner stops as soon as

- *separated*: the 99% t-interval of that ratio excludes 1 (the faster one is chosen), or
- *equivalent*: the interval lies within ±TIE (the cheaper one is chosen),

and otherwise runs another round while one fits in the budget. When the budget ends first,
the two are *tied* within this machine's noise: the one measured faster is chosen where they
measured more than ±TIE apart (the geometric mean of the pairs' ratios), else the cheaper
one, and the report says so. A 99% interval (not 95%) because the interval is looked at after every round.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .search import DIMENSIONS, Config

#: Ratios within ±5% are "as good as each other".
TIE = 0.05
#: Student's t, two-sided 99% (the 0.995 quantile), by degrees of freedom 1..30.
_T99 = (
    63.657,
    9.925,
    5.841,
    4.604,
    4.032,
    3.707,
    3.499,
    3.355,
    3.250,
    3.169,
    3.106,
    3.055,
    3.012,
    2.977,
    2.947,
    2.921,
    2.898,
    2.878,
    2.861,
    2.845,
    2.831,
    2.819,
    2.807,
    2.797,
    2.787,
    2.779,
    2.771,
    2.763,
    2.756,
    2.750,
)


def key(config: Config) -> tuple:
    return tuple(config[d] for d in DIMENSIONS)


def t99(dof: int) -> float:
    """The two-sided 99% quantile of Student's t (beyond 30 degrees of freedom, 30's: conservative)."""
    if dof < 1:
        return math.inf
    return _T99[min(dof, len(_T99)) - 1]


def cost(config: Config) -> tuple:
    """Orders configurations by what they take from training: fewer workers, then fewer
    batches kept ready, then threads before processes (a process copies the dataset's
    state), then smaller batches. No workers at all comes last: loading in the main process
    takes its time from the training step, which a measurement of the loader alone does not show."""
    return (
        config["num_workers"] == 0,
        config["num_workers"],
        config["prefetch_factor"],
        config["backend"] != "thread",
        config["batch_size"],
    )


@dataclass(frozen=True)
class Comparison:
    """How much faster one configuration is than another, from paired runs (their ratios)."""

    ratios: tuple[float, ...]

    def __post_init__(self) -> None:
        if any(not r > 0 for r in self.ratios):
            raise ValueError(f"ratios must be positive, got {self.ratios}")

    @property
    def ratio(self) -> float:
        """The geometric mean of the pairs' ratios (1.0 with none)."""
        return math.exp(statistics.fmean(math.log(r) for r in self.ratios)) if self.ratios else 1.0

    @property
    def interval(self) -> tuple[float, float]:
        """The 99% t-interval of the ratio; (0, inf) with fewer than two pairs."""
        n = len(self.ratios)
        if n < 2:
            return 0.0, math.inf
        logs = [math.log(r) for r in self.ratios]
        half = t99(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        mean = statistics.fmean(logs)
        return math.exp(mean - half), math.exp(mean + half)

    @property
    def separated(self) -> bool:
        low, high = self.interval
        return low > 1 or high < 1

    @property
    def equivalent(self) -> bool:
        low, high = self.interval
        return low >= 1 / (1 + TIE) and high <= 1 + TIE

    def inverted(self) -> Comparison:
        return Comparison(tuple(1 / r for r in self.ratios))

    def describe(self) -> str:
        low, high = self.interval
        span = f"99% interval {low:.2f}-{high:.2f}x" if math.isfinite(high) else "no interval yet"
        return f"{self.ratio:.2f}x ({span}, {len(self.ratios)} interleaved pairs)"


def apart(comparison: Comparison) -> bool:
    """Whether the two measured more than :data:`TIE` apart (the geometric mean of their pairs'
    ratios), whatever the noise."""
    return abs(math.log(comparison.ratio)) > math.log(1 + TIE)


@dataclass(frozen=True)
class Decision:
    """The configuration chosen from the finalists, and why."""

    chosen: Config
    other: Config | None  # the other finalist
    outcome: str  # "single", "separated", "equivalent" or "tied"
    comparison: Comparison | None  # chosen against other
    rounds: int
    elapsed_s: float
    budget_s: float
    runs: Mapping[tuple, tuple[float, ...]] = field(default_factory=dict)  # each configuration's rates, by key

    def as_dict(self) -> dict:
        c = self.comparison
        return {
            "outcome": self.outcome,
            "chosen": dict(self.chosen),
            "other": dict(self.other) if self.other is not None else None,
            "ratio": c.ratio if c else None,
            "interval": list(c.interval) if c and len(c.ratios) > 1 else None,
            "pair_ratios": list(c.ratios) if c else [],
            "rounds": self.rounds,
            "elapsed_s": self.elapsed_s,
            "budget_s": self.budget_s,
        }


def round_order(finalists: Sequence[Config], baseline: Config | None) -> list[Config]:
    """``A B C B A`` (``A B B A`` without a baseline, ``A C A`` without a runner-up)."""
    middle = [baseline] if baseline is not None else []
    return [*finalists, *middle, *reversed(finalists)]


def pair_ratios(order: Sequence[Config], rates: Sequence[float]) -> list[float]:
    """A/B of the adjacent pairs of one round run in ``order`` (its first and last two)."""
    if len(order) < 4 or key(order[0]) != key(order[-1]) or key(order[1]) != key(order[-2]):
        return []
    return [rates[0] / rates[1], rates[-1] / rates[-2]]


def decide(
    finalists: Sequence[Config],
    measure: Callable[[Config], float],
    *,
    baseline: Config | None = None,
    min_rounds: int = 2,
    budget_s: float = 90.0,
    clock: Callable[[], float] = time.perf_counter,
) -> Decision:
    """Runs rounds of the finalists (one or two configurations) until they are told apart
    or the budget ends (see the module docstring).

    Args:
        finalists: The leader first, then the runner-up (if any).
        measure: Runs one configuration and returns its samples/s.
        baseline: Also run once in each of the first ``min_rounds`` rounds, when it is
            not a finalist (so its figure is measured beside theirs).
        min_rounds: Rounds run whatever the budget (at least 1).
        budget_s: Seconds after which no further round starts (one starts only when the
            time a round took so far still fits).
        clock: Seconds, for the budget (a fake one in tests).
    """
    if not 1 <= len(finalists) <= 2:
        raise ValueError(f"finalists must be one or two configurations, got {len(finalists)}")
    if min_rounds < 1:
        raise ValueError(f"min_rounds must be >= 1, got {min_rounds}")
    if budget_s < 0:
        raise ValueError(f"budget_s must be >= 0, got {budget_s}")
    if baseline is not None and key(baseline) in {key(c) for c in finalists}:
        baseline = None
    start = clock()
    runs: dict[tuple, list[float]] = {}
    ratios: list[float] = []
    rounds, run_seconds, runs_made = 0, 0.0, 0
    comparison = None
    while True:
        order = round_order(finalists, baseline if rounds < min_rounds else None)
        if len(order) < 2:
            break  # one configuration and nothing to measure it beside
        if rounds >= min_rounds:
            if comparison is None or comparison.separated or comparison.equivalent:
                break
            per_run = run_seconds / runs_made
            if clock() - start + per_run * len(order) > budget_s:
                break
        t0 = clock()
        rates = [measure(c) for c in order]
        run_seconds, runs_made = run_seconds + clock() - t0, runs_made + len(order)
        for c, r in zip(order, rates):
            runs.setdefault(key(c), []).append(r)
        ratios += pair_ratios(order, rates)
        comparison = Comparison(tuple(ratios)) if len(finalists) == 2 else None
        rounds += 1
    elapsed = clock() - start
    frozen = {k: tuple(v) for k, v in runs.items()}
    if len(finalists) == 1:
        return Decision(dict(finalists[0]), None, "single", None, rounds, elapsed, budget_s, frozen)
    a, b = finalists
    assert comparison is not None  # two finalists always run at least one round
    if comparison.separated:
        chosen, outcome = (a if comparison.ratio > 1 else b), "separated"
    elif comparison.equivalent or not apart(comparison):
        chosen, outcome = min((a, b), key=cost), ("equivalent" if comparison.equivalent else "tied")
    else:
        # Tied, yet measured apart by more than TIE: the noise leaves the faster one likelier
        # faster than not, and the cheaper one is a loss wherever it is slower (the finalists of
        # a machine that calmed down mid-run: 1 worker 0.84x 2 workers, 0.61-0.70x in the quiet rounds).
        chosen, outcome = (a if comparison.ratio > 1 else b), "tied"
    other = b if chosen is a else a
    versus = comparison if chosen is a else comparison.inverted()
    return Decision(dict(chosen), dict(other), outcome, versus, rounds, elapsed, budget_s, frozen)
