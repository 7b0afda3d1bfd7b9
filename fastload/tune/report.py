"""The tuner's report for people: the table, the noise verdict, the throughput plot."""

from __future__ import annotations

from typing import Any

from .search import DIMENSIONS


def print_table(report: dict) -> None:
    rows = sorted(report["measurements"], key=lambda m: (m["batch_size"], m["backend"], m["num_workers"],
                                                         m["prefetch_factor"]))
    best = report["best"]
    print(f"\n{'':2}{'batch':>6} {'workers':>7} {'prefetch':>8} {'backend':>8} {'pin':>5} {'samples/s':>10} "
          f"{'cpu %':>6} {'PSS MB':>7}")
    for m in rows:
        mark = "* " if all(m[d] == best[d] for d in DIMENSIONS) else "  "
        print(f"{mark}{m['batch_size']:>6} {m['num_workers']:>7} {m['prefetch_factor']:>8} {m['backend']:>8} "
              f"{str(m['pin_memory']):>5} {m['samples_per_s']:>10.0f} {m['cpu_percent']:>6.0f} "
              f"{m['peak_pss'] / 1e6:>7.0f}")
    b = report["baseline"]
    print(f"* best: batch {best['batch_size']}, {best['num_workers']} workers, prefetch {best['prefetch_factor']}, "
          f"{best['backend']} backend: {report['best_samples_per_s']:.0f} samples/s, "
          f"{report['speedup_over_baseline']:.2f}x PyTorch's default (num_workers=0, batch {b['batch_size']}: "
          f"{b['samples_per_s']:.0f}/s)")
    v = report["bottleneck"]
    stages = ", ".join(f"{k} {r:.0f}/s" for k, r in v["stages_samples_per_s"].items())
    print(f"bottleneck: {v['bound_by']} ({stages}; the pipeline runs at {v['pipeline_share_of_bound']:.0%} of it)")
    print(report["noise"]["advice"])
    extra = "" if report["baseline_in_grid"] else " and the baseline"
    print(f"measured {report['measured']} of {report['grid_size']} configurations ({report['search']} search){extra} "
          f"in {report['elapsed_s']:.0f} s")
    if "model" in report:
        m = report["model"]
        print(f"model {m['name']}: {m['samples_per_s']:.0f} samples/s at batch {m['batch_size']} "
              f"(largest that fits: {m['max_batch_size']}); input-bound: {m['input_bound']}")


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


def plot(report: dict, path: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(path, dpi=100)
    plt.close(fig)
