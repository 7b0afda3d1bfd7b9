"""``fastload tune``'s command-line options, and the command line that gives a namespace."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

#: Default seconds for re-running the finalists until they separate (``--budget``).
BUDGET = 90.0


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{what} is empty")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds ``fastload tune``'s arguments to ``p``."""
    p.add_argument("dataset", help="image folder, list file, LMDB, or TFRecord file(s)/glob")
    p.add_argument(
        "--root",
        default=None,
        metavar="DIR",
        help="folder the paths of a list file are relative to (default: the list file's folder)",
    )
    p.add_argument(
        "--batch-sizes",
        type=lambda t: _ints(t, "--batch-sizes"),
        default=[64, 128, 256],
        metavar="N,N,...",
        help="batch sizes to try (default: 64,128,256)",
    )
    p.add_argument(
        "--workers",
        type=lambda t: _ints(t, "--workers"),
        default=None,
        metavar="N,N,...",
        help="worker counts (default: 0,1,2,4,... up to the CPUs available)",
    )
    p.add_argument(
        "--prefetch",
        type=lambda t: _ints(t, "--prefetch"),
        default=[2],
        metavar="N,N,...",
        help="prefetch factors to try: batches each worker keeps ready (default: 2)",
    )
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pin host batches (default: when the device is CUDA)",
    )
    p.add_argument("--backends", default="process,thread", help="comma-separated: process, thread (default: both)")
    p.add_argument(
        "--transform",
        choices=["train", "eval"],
        default="train",
        help="the preset measured: train (random resized crop + flip) or eval (resize + centre crop) (default: train)",
    )
    p.add_argument("--size", type=int, default=224, help="output image size of the transform (default: 224)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per configuration (default: 3)")
    p.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="interleaved runs (rounds A B B A) of each of the two finalists before the tuner may "
        "decide between them; rounded up to even (default: 4; at least 2)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=BUDGET,
        metavar="SECONDS",
        help="after those, more rounds while noise cannot decide, until this many seconds of "
        f"re-running have passed (default: {BUDGET:.0f})",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where batches are delivered (default: cuda if available, else cpu)",
    )
    p.add_argument("--grid", action="store_true", help="measure every combination (default: adaptive)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write every measurement as JSON")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="plot throughput against workers")
    p.add_argument(
        "--save-profile",
        action="store_true",
        help="let num_workers='auto' use the chosen configuration (when noise cannot separate the two "
        "finalists within --budget, the cheaper one, and the output says so)",
    )
    p.add_argument(
        "--forget",
        action="store_true",
        help="remove the profile saved for this machine and DATASET, and measure nothing",
    )
    p.add_argument("--model", default=None, help="(CUDA) time a training step of this torchvision/timm model")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastload tune")
    add_arguments(parser)
    return parser


def command_line(args: argparse.Namespace, **changes: Any) -> str:
    """The ``fastload tune`` command that gives ``args`` (every option that differs from its
    default), with ``changes`` (option dests to values) applied: a re-run to suggest."""
    values = {**vars(args), **changes}
    words = ["fastload", "tune"]
    for action in _parser()._actions:  # argparse lists a parser's options nowhere public
        if not action.option_strings:  # the dataset
            words.append(values[action.dest])
            continue
        value = values.get(action.dest, action.default)
        if action.dest == "help" or value == action.default:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            words.append(action.option_strings[0 if value else 1])
        elif action.nargs == 0:  # store_true
            words.append(action.option_strings[0])
        else:
            text = (
                ",".join(map(str, value))
                if isinstance(value, list)
                else f"{value:g}"
                if isinstance(value, float)
                else str(value)
            )
            words += [action.option_strings[0], text]
    return shlex.join(words)
