"""``fastload tune --save-profile`` and ``--forget``: the chosen configuration kept for
``Loader(num_workers='auto')`` on this machine and dataset, or removed."""

from __future__ import annotations

import argparse
import sys

from .dataset import open_tuned, short_batches, small_dataset_warning
from .decide import TIE
from .files import reason


def slower_than_default(report: dict) -> str | None:
    """Why no profile may be saved from ``report``: its chosen configuration measured slower
    than PyTorch's default beyond the noise, by more than the ``TIE`` within which the tuner
    counts two as equal (a tie on a busy machine chooses the cheaper finalist where the two
    measured within 5%). None where it did not (or is the default itself)."""
    speedup = report["speedup_over_baseline"]
    if speedup is None or speedup * (1 + TIE) >= 1:
        return None
    return (
        f"the chosen configuration measured {speedup:.2f}x PyTorch's default (num_workers=0, batch "
        f"{report['baseline']['batch_size']}), slower by more than the {TIE:.0%} the tuner counts as noise"
    )


def forget(args: argparse.Namespace) -> int:
    """``fastload tune DATASET --forget``: removes this machine's profile for DATASET."""
    from ..loading.profiles import forget as remove

    path = remove(open_tuned(args))
    print(
        f"removed profile {path}: Loader(num_workers='auto') on {args.dataset} uses the CPUs available again"
        if path
        else f"no saved profile for {args.dataset} on this machine"
    )
    return 0


def save_profile(args: argparse.Namespace, report: dict) -> bool:
    """Saves the chosen configuration for ``num_workers='auto'``, saying how it was chosen; False
    (and why, on stderr) where it is not saved."""
    from ..loading.profiles import forget_hint, save

    slower = slower_than_default(report)
    if slower:
        print(
            f"fastload tune: error: no profile saved: {slower}: Loader(num_workers='auto') would load slower "
            "than num_workers=0. Re-run with a larger --budget, larger --batch-sizes or on a quieter machine",
            file=sys.stderr,
        )
        return False
    dataset = open_tuned(args)
    best = report["best"]
    if short_batches(len(dataset), [best["batch_size"]]):
        warning = small_dataset_warning(args.dataset, len(dataset), [best["batch_size"]])
        print(f"fastload tune: error: no profile saved: {warning}", file=sys.stderr)
        return False
    result = {
        **best,
        "samples_per_s": report["best_samples_per_s"],
        "runs": report["best_runs"],
        "figure": "median of runs",
        "decision": report["decision"]["outcome"],
    }
    try:
        path = save(dataset, report["config"], result)
    except OSError as e:
        print(f"fastload tune: error: no profile saved: {e.filename or 'its file'}: {reason(e)}", file=sys.stderr)
        return False
    why = {
        "single": "the only configuration measured",
        "separated": "faster than the other finalist beyond the noise",
        "equivalent": "the cheaper of two finalists within 5% of each other",
        "tied": "the cheaper of two finalists this machine's noise could not separate within --budget",
    }
    if report["decision"]["outcome"] == "tied" and report["decision"]["ratio"] > 1 + TIE:
        why["tied"] = (
            "measured faster by more than 5% than the other finalist, which this machine's noise could not "
            "separate from it within --budget"
        )
    workers = best["num_workers"]
    print(
        f"saved profile {path}: Loader(num_workers='auto') now uses {workers} worker{'' if workers == 1 else 's'} "
        f"({why[report['decision']['outcome']]}); {forget_hint(dataset)}"
    )
    return True
