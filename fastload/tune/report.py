"""The tuner's report for people: the table, the noise verdict, the throughput plot."""

from __future__ import annotations

from typing import IO, Any

from .decide import TIE, cost
from .search import DIMENSIONS


def _config(c: dict) -> str:
    workers = f"{c['num_workers']} worker{'' if c['num_workers'] == 1 else 's'}"
    return f"batch {c['batch_size']}, {workers}, prefetch {c['prefetch_factor']}, {c['backend']} backend"


def _runs(n: int) -> str:
    return f"median of {n} run{'s' if n != 1 else ''}"


def _cheaper(chosen: dict, other: dict) -> str:
    """Why ``chosen`` costs training less than ``other`` (the order of :func:`.decide.cost`)."""
    if other["num_workers"] == 0:
        return "workers rather than loading in the training process"
    if chosen["num_workers"] != other["num_workers"]:
        return "fewer workers"
    if chosen["prefetch_factor"] != other["prefetch_factor"]:
        return "fewer batches prefetched"
    return "threads rather than processes" if chosen["backend"] != other["backend"] else "a smaller batch"


def decision_lines(report: dict) -> list[str]:
    """How the chosen configuration was told from the other finalist, in words."""
    d = report["decision"]
    if d["outcome"] == "single":
        return ["decision: only one configuration could be chosen (every other one would save the same profile)"]
    other = d["other"]
    span = f"99% interval {d['interval'][0]:.2f}-{d['interval'][1]:.2f}x" if d["interval"] else "too few runs"
    measured = (
        f"{len(d['pair_ratios'])} interleaved pairs in {d['rounds']} A B B A rounds, "
        f"{d['elapsed_s']:.0f} s of a {d['budget_s']:.0f} s budget"
    )
    versus = f"the chosen one runs at {d['ratio']:.2f}x {_config(other)} ({span}; {measured})"
    if d["outcome"] == "separated":
        return [f"decision: separated beyond the noise: {versus}"]
    cheaper = _cheaper(d["chosen"], other)
    if d["outcome"] == "equivalent":
        return [f"decision: equivalent, within 5% of each other: {versus}; chose the cheaper ({cheaper})"]
    if d["ratio"] <= 1 + TIE:
        chose = f"the cheaper ({cheaper}) was chosen"
    elif cost(d["chosen"]) < cost(other):
        chose = f"the one measured faster by more than 5%, also the cheaper ({cheaper}), was chosen"
    else:
        chose = f"the one measured faster by more than 5% was chosen over the cheaper ({_cheaper(other, d['chosen'])})"
    return [
        f"decision: statistically tied: {versus}: this machine's noise hides any difference, so {chose}",
        f"  to tell them apart, give it more time (or re-run on a quieter machine): {d['rerun']}",
    ]


def print_table(report: dict) -> None:
    rows = sorted(
        report["measurements"], key=lambda m: (m["batch_size"], m["backend"], m["num_workers"], m["prefetch_factor"])
    )
    best, d = report["best"], report["decision"]
    other = d["other"] or {}
    print(f"\nsamples/s: {report['figure']}.\n* chosen   + the other finalist (both re-run interleaved)")
    print(
        f"{'':2}{'batch':>6} {'workers':>7} {'prefetch':>8} {'backend':>8} {'pin':>5} {'samples/s':>10} "
        f"{'runs':>4} {'cpu %':>6} {'PSS MB':>7}"
    )
    for m in rows:
        mark = (
            "* "
            if all(m[k] == best[k] for k in DIMENSIONS)
            else "+ "
            if other and all(m[k] == other[k] for k in DIMENSIONS)
            else "  "
        )
        print(
            f"{mark}{m['batch_size']:>6} {m['num_workers']:>7} {m['prefetch_factor']:>8} {m['backend']:>8} "
            f"{str(m['pin_memory']):>5} {m['samples_per_s']:>10.0f} {len(m['runs']):>4} {m['cpu_percent']:>6.0f} "
            f"{m['peak_pss'] / 1e6:>7.0f}"
        )
    b = report["baseline"]
    if b["is_best"]:
        versus = "this is PyTorch's default (num_workers=0) itself: workers did not help on this machine"
    else:
        versus = (
            f"{report['speedup_over_baseline']:.2f}x PyTorch's default (num_workers=0, batch {b['batch_size']}: "
            f"{b['samples_per_s']:.0f} samples/s, {_runs(b['runs'])})"
        )
    print(
        f"* chosen: {_config(best)}: {report['best_samples_per_s']:.0f} samples/s ({_runs(report['best_runs'])}); "
        f"{versus}"
    )
    for line in decision_lines(report):
        print(line)
    v = report["bottleneck"]
    stages = ", ".join(f"{k} {r:.0f}/s" for k, r in v["stages_samples_per_s"].items())
    print(f"bottleneck: {v['bound_by']} ({stages}; the pipeline runs at {v['pipeline_share_of_bound']:.0%} of it)")
    for w in report["warnings"]:
        print(f"warning: {w}")
    extra = "" if report["baseline_in_grid"] else " and the baseline"
    print(
        f"measured {report['measured']} of {report['grid_size']} configurations ({report['search']} search){extra} "
        f"in {report['elapsed_s']:.0f} s"
    )
    if "model" in report:
        m = report["model"]
        print(
            f"model {m['name']}: {m['samples_per_s']:.0f} samples/s at batch {m['batch_size']} "
            f"(largest that fits: {m['max_batch_size']}); input-bound: {m['input_bound']}"
        )


def figure(report: dict) -> Any:
    """The throughput-against-workers figure of ``report`` (a matplotlib Figure)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'fastload[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # worker counts are whole
    series: dict = {}
    for m in report["measurements"]:
        series.setdefault((m["batch_size"], m["backend"]), []).append((m["num_workers"], m["samples_per_s"]))
    for (bs, backend), points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"batch {bs}, {backend}")
    ax.set_xlabel("workers")
    ax.set_ylabel("samples/s")
    ax.set_title(f"fastload tune: {report['dataset'].get('type', '')} on {report['machine']['cpu']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot(report: dict, out: str | IO[bytes], format: str | None = None) -> None:
    """Saves :func:`figure` to ``out`` (a path, or a binary file with ``format``: "png", "svg", ...)."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(out, dpi=100, format=format)
    plt.close(fig)
