"""The command line of tools/folder2lmdb.py, tools/folder2tfrecord.py and tools/folder2wds.py."""

from __future__ import annotations

import argparse
import os

from .run import convert
from .staging import NO_SPACE_EXIT, NoSpaceError
from .verify import VerifyError

EXIT_CODES = (
    f"exit status: 0 converted; 1 written, but --verify found bad records; 2 bad input or arguments; "
    f"{NO_SPACE_EXIT} no space left on DST's filesystem (the partial output is removed and the "
    "message says about how much more is needed)"
)


def byte_size(text: str) -> int:
    """``"500MB"``, ``"1.5G"``, ``"4096"`` as bytes (K, M, G, T: powers of 1000)."""
    units = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    body = text.strip().upper().removesuffix("B")
    unit = body[-1:] if body[-1:] in units else ""
    try:
        value = float(body[: len(body) - len(unit)]) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500MB, 1G, 4096)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a shard size must be at least 1 byte, got {text!r}")
    return int(value)


def _left(dst: str) -> str:
    """What an interrupted conversion left at ``dst``: an output is renamed into place only once
    written, and then read back when verifying (interrupted then, it stays, not verified)."""
    if os.path.exists(dst):
        return f"{dst} is as it was, or written and not verified if the read-back had begun"
    return f"nothing written to {dst}"


def main(fmt: str, argv: list[str] | None = None, description: str = "") -> int:
    """Parses ``argv`` and converts; exits 2 on bad input, 1 when ``--verify`` finds bad records,
    3 (``NO_SPACE_EXIT``) when DST's filesystem fills up."""
    p = argparse.ArgumentParser(description=description, epilog=EXIT_CODES)
    p.add_argument("src", help="image folder, list file, LMDB or TFRecord file(s)/glob")
    p.add_argument("dst", help="output LMDB directory" if fmt == "lmdb" else "output folder for the shards")
    if fmt == "tfrecord":
        p.add_argument("--shards", type=int, default=1, help="number of TFRecord files (default: %(default)s)")
    if fmt == "wds":
        size = p.add_mutually_exclusive_group()
        size.add_argument(
            "--shard-size",
            type=byte_size,
            default=None,
            metavar="BYTES",
            help="target bytes per shard, e.g. 500MB (default: 1GB)",
        )
        size.add_argument("--shard-samples", type=int, default=None, metavar="N", help="samples per shard")
        p.add_argument("--seed", type=int, default=0, help="the order samples are written in (default: %(default)s)")
        p.add_argument(
            "--no-shuffle",
            action="store_true",
            help="write samples in the source's order (a stream "
            "mixes only a few shards at a time: keep this off for class-sorted sources)",
        )
    p.add_argument("--workers", type=int, default=4, help="parallel readers (default: %(default)s)")
    p.add_argument("--resize-shorter", type=int, default=None, metavar="S", help="re-encode with shorter side <= S")
    p.add_argument("--quality", type=int, default=None, metavar="Q", help="re-encode as JPEG at quality Q")
    p.add_argument("--root", default=None, help="root of the paths in a list file")
    p.add_argument(
        "--verify",
        action="store_true",
        help="decode every image strictly while writing and record the CRC32C of those it accepts in the "
        "dataset's metadata (readers then decode them cheaply while the checksum holds); read everything back "
        "and check it",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace DST if it is a converter's output (never a folder of anything else, nor SRC)",
    )
    args = p.parse_args(argv)
    kwargs = {"root": args.root} if args.root else {}
    try:
        if fmt == "tfrecord":
            kwargs.update(shards=args.shards)
        if fmt == "wds":
            kwargs.update(
                shard_bytes=args.shard_size,
                shard_samples=args.shard_samples,
                shuffle_seed=None if args.no_shuffle else args.seed,
            )
        stats = convert(
            args.src,
            args.dst,
            fmt,
            workers=args.workers,
            resize_shorter=args.resize_shorter,
            quality=args.quality,
            verify_output=args.verify,
            overwrite=args.overwrite,
            **kwargs,
        )
    except NoSpaceError as e:
        p.exit(NO_SPACE_EXIT, f"{p.prog}: error: {e}\n")
    except VerifyError as e:
        p.exit(
            1,
            f"{p.prog}: wrote {args.dst}, but {len(e.failures)} of {e.total} records failed "
            f"verification:\n  " + "\n  ".join(e.failures) + "\n",
        )
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback (the partial output is removed); SIGINT's status
        p.exit(130, f"\n{p.prog}: interrupted ({_left(args.dst)})\n")
    print(
        f"wrote {stats['records']} records to {args.dst} ({stats['bytes'] / 1e6:.1f} MB) in "
        f"{stats['seconds']:.1f} s: {stats['images_per_s']:.0f} images/s" + (", verified" if args.verify else "")
    )
    return 0
