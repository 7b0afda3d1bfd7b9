"""The command line of tools/folder2lmdb.py and tools/folder2tfrecord.py."""

from __future__ import annotations

import argparse

from .run import convert
from .verify import VerifyError


def main(fmt: str, argv: list[str] | None = None, description: str = "") -> int:
    """Parses ``argv`` and converts; exits 2 on bad input, 1 when ``--verify`` finds bad records."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("src", help="image folder, list file, LMDB or TFRecord file(s)/glob")
    p.add_argument("dst", help="output LMDB directory" if fmt == "lmdb" else "output folder for the shards")
    if fmt == "tfrecord":
        p.add_argument("--shards", type=int, default=1, help="number of TFRecord files (default: %(default)s)")
    p.add_argument("--workers", type=int, default=4, help="parallel readers (default: %(default)s)")
    p.add_argument("--resize-shorter", type=int, default=None, metavar="S", help="re-encode with shorter side <= S")
    p.add_argument("--quality", type=int, default=None, metavar="Q", help="re-encode as JPEG at quality Q")
    p.add_argument("--root", default=None, help="root of the paths in a list file")
    p.add_argument("--verify", action="store_true", help="read everything back, check it and decode every image")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    args = p.parse_args(argv)
    kwargs = {"root": args.root} if args.root else {}
    try:
        stats = convert(args.src, args.dst, fmt, shards=getattr(args, "shards", 1), workers=args.workers,
                        resize_shorter=args.resize_shorter, quality=args.quality, verify_output=args.verify,
                        overwrite=args.overwrite, **kwargs)
    except VerifyError as e:
        p.exit(1, f"{p.prog}: wrote {args.dst}, but {len(e.failures)} of {e.total} records failed "
                  f"verification:\n  " + "\n  ".join(e.failures) + "\n")
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    print(f"wrote {stats['records']} records to {args.dst} ({stats['bytes'] / 1e6:.1f} MB) in "
          f"{stats['seconds']:.1f} s: {stats['images_per_s']:.0f} images/s" + (", verified" if args.verify else ""))
    return 0
