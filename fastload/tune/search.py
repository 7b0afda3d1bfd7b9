"""Search over loader configurations: exhaustive grid, or an adaptive climb.

Pure logic over a ``measure(config) -> samples/s`` function, so it is tested against
known throughput surfaces.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Config = dict  # {"batch_size", "num_workers", "prefetch_factor", "backend", "pin_memory"}
DIMENSIONS = ("batch_size", "num_workers", "prefetch_factor", "backend", "pin_memory")


@dataclass
class Space:
    """Candidate values per dimension (each non-empty, sorted where ordered)."""

    batch_sizes: Sequence[int]
    workers: Sequence[int]
    prefetch: Sequence[int] = (2,)
    backends: Sequence[str] = ("process",)
    pin: Sequence[bool] = (False,)
    values: dict = field(init=False)

    def __post_init__(self) -> None:
        self.values = {
            "batch_size": sorted(set(self.batch_sizes)),
            "num_workers": sorted(set(self.workers)),
            "prefetch_factor": sorted(set(self.prefetch)),
            "backend": list(dict.fromkeys(self.backends)),
            "pin_memory": list(dict.fromkeys(self.pin)),
        }
        for name, vals in self.values.items():
            if not vals:
                raise ValueError(f"no candidate values for {name}")
        if any(b < 1 for b in self.values["batch_size"]):
            raise ValueError(f"batch sizes must be >= 1, got {self.values['batch_size']}")
        if any(w < 0 for w in self.values["num_workers"]):
            raise ValueError(f"worker counts must be >= 0, got {self.values['num_workers']}")
        if any(p < 1 for p in self.values["prefetch_factor"]):
            raise ValueError(f"prefetch factors must be >= 1, got {self.values['prefetch_factor']}")

    @staticmethod
    def valid(config: Config) -> bool:
        return not (config["backend"] == "thread" and config["num_workers"] == 0)

    def grid(self) -> list[Config]:
        combos = itertools.product(*(self.values[d] for d in DIMENSIONS))
        return [c for c in (dict(zip(DIMENSIONS, combo)) for combo in combos) if self.valid(c)]


class Searcher:
    """Measures each configuration at most once and remembers the results."""

    def __init__(self, measure: Callable[[Config], float], on_result: Callable | None = None) -> None:
        self.measure = measure
        self.on_result = on_result
        self.results: list[tuple[Config, float]] = []
        self._seen: dict[tuple, float] = {}

    def __call__(self, config: Config) -> float:
        key = tuple(config[d] for d in DIMENSIONS)
        if key not in self._seen:
            self._seen[key] = rate = self.measure(config)
            self.results.append((dict(config), rate))
            if self.on_result is not None:
                self.on_result(config, rate)
        return self._seen[key]

    def best(self) -> tuple[Config, float]:
        return max(self.results, key=lambda r: r[1])


def grid_search(space: Space, searcher: Searcher) -> tuple[Config, float]:
    for config in space.grid():
        searcher(config)
    return searcher.best()


def adaptive_search(
    space: Space, searcher: Searcher, min_gain: float = 0.05, patience: int = 2
) -> tuple[Config, float]:
    """Per batch size, add workers (from one) until ``patience`` counts in a row gain less
    than ``min_gain`` over the best of the climb; then, around the best point, try each other
    setting one at a time and the neighbouring worker counts and batch sizes, until no single
    change helps.

    Each configuration is measured once (:class:`Searcher`), so one run slowed by noise would
    keep its worker count out for good: with ``patience`` 1 the climb stopped there and never
    saw the counts beyond it.
    """
    v = space.values
    base = {"prefetch_factor": v["prefetch_factor"][0], "backend": v["backend"][0], "pin_memory": v["pin_memory"][0]}
    for bs in v["batch_size"]:
        best_here: float | None = None
        misses = 0
        for w in v["num_workers"]:
            config = {"batch_size": bs, "num_workers": w, **base}
            if not space.valid(config):
                continue
            rate = searcher(config)
            if w == 0:  # in-process loading is a different regime, not the first step of the climb
                continue
            if best_here is not None and rate < best_here * (1 + min_gain):
                misses += 1
                best_here = max(best_here, rate)
                if misses >= patience:
                    break
                continue
            best_here, misses = rate, 0
    while True:  # coordinate refinement until no single change helps
        best, best_rate = searcher.best()
        for dim in ("prefetch_factor", "backend", "pin_memory", "num_workers", "batch_size"):
            values = v[dim]
            if dim in ("num_workers", "batch_size"):  # ordered: only the neighbours
                i = values.index(best[dim])
                values = values[max(0, i - 1) : i + 2]
            for value in values:
                config = {**best, dim: value}
                if space.valid(config):
                    searcher(config)
        if searcher.best()[1] <= best_rate:
            break
    return searcher.best()
