"""The ``fastload`` command: ``demo``, ``info``, ``tune`` and ``verify``."""

from __future__ import annotations

import argparse
import os
import sys
import time


def _throughput(dataset, epochs: int = 2, **options) -> tuple[float, dict]:
    import fastload as fl

    with fl.Loader(dataset, **options) as loader:
        images, start = 0, time.perf_counter()
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            if epoch == 1:  # the first epoch includes worker start-up
                images, start = 0, time.perf_counter()
            for x, _ in loader:
                images += x.shape[0]
        return images / (time.perf_counter() - start), loader.stats()


def cmd_demo(args: argparse.Namespace) -> int:
    import fastload as fl
    from fastload.decode import default_backend
    from fastload.photos.jpegs import format_jpeg_stats, jpeg_stats, make_photo_dataset
    from fastload.system import available_cpus

    # Real photographs (cut from scikit-image's bundled ones), not synthetic noise:
    # decode speed depends on how images compress.
    root = os.path.join(args.data, f"photos{args.images}")
    make_photo_dataset(root, num_images=args.images, progress=True)
    workers = available_cpus()
    print(f"decoder: {default_backend()}   CPUs available: {workers}")
    print(format_jpeg_stats(jpeg_stats(root)))
    folder = fl.ImageFolder(root, transform=fl.transforms.train(224))
    print(f"dataset: {folder.summary()}")
    rate, stats = _throughput(folder, batch_size=64, shuffle=True, num_workers=workers, seed=0)
    print(
        f"ImageFolder → Loader (train 224, {workers} workers, batch 64, {stats['batches']} batches): "
        f"{rate:.0f} images/s (a loop with no training step: it only waits for data)"
    )
    from fastload.convert import convert

    for fmt in ("lmdb", "tfrecord"):
        dst = os.path.join(args.data, f"train.{fmt}")
        made = convert(root, dst, fmt, shards=4, workers=workers, verify_output=True, overwrite=True, progress=False)
        ds = fl.open_dataset(dst, transform=fl.transforms.train(224))
        rate, _ = _throughput(ds, batch_size=64, shuffle=True, num_workers=workers, seed=0)
        print(
            f"converted to {fmt} at {made['images_per_s']:.0f} images/s (verified) → {type(ds).__name__} "
            f"→ Loader: {rate:.0f} images/s"
        )
    from fastload.tune import build_args, print_table, run

    print("\nfastload tune (short: batch 32 and 64, 1 s per configuration, 20 s to decide between the finalists):")
    print_table(run(build_args([root, "--batch-sizes", "32,64", "--seconds", "1", "--budget", "20"])))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    from fastload.decode import BACKENDS, JPEG_BACKENDS, default_backend, get_decoder, roi
    from fastload.decode.simple import SimpleJPEGDecoder
    from fastload.decode.turbo import TurboJPEGDecoder
    from fastload.system import available_cpus, cpu_model

    print(f"fastload {__import__('fastload').__version__}, torch {torch.__version__}")
    print(f"CPU: {cpu_model()} ({available_cpus()} available)")
    print(f"CUDA: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'not available'}")
    for name in BACKENDS:
        try:
            dec = get_decoder(name)
        except ImportError as e:
            print(f"decoder {name}: unavailable ({e})")
            continue
        detail = ""
        if isinstance(dec, SimpleJPEGDecoder):
            detail = f"simplejpeg {dec.version}, libjpeg-turbo bundled, "
        elif isinstance(dec, TurboJPEGDecoder):
            detail = f"system library {dec.library_file()}, "
        strict = "strict" if name in JPEG_BACKENDS else "JPEG not strict"
        print(f"decoder {name}: ok ({detail}{strict})")
    print(f"default decoder: {default_backend()}{_measured()}")
    # Which region decoder runs, by name and library version (issue 39: the fastest one pip offers).
    if roi.trusted():
        region = f"{roi.describe()}, planned for every file: FASTLOAD_ROI=trusted (deprecated)"
    elif roi.region_available():
        region = (
            f"{roi.describe()}, planned only for bytes verified strictly before "
            "(fastload verify DIR, converters' --verify): it cannot see corrupt data"
        )
    else:
        try:
            roi.get_region_decoder()
            region = "off (FASTLOAD_ROI=0)"
        except ImportError:
            region = f"none (not installed: {roi.EXTRA_HINT})"
    print(f"region decoder: {region}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """``fastload verify DIR``: every image decoded strictly, the manifest of those that passed
    written into DIR (:mod:`fastload.verified`); status 1 when any failed, unless ``--allow-bad``."""
    from fastload.convert.manifest import verify_folder

    report = verify_folder(args.dir, manifest=args.manifest, workers=args.workers, progress=not args.quiet)
    for rel, why in report.failed:
        print(f"FAILED {os.path.join(args.dir, rel)}: {why}", file=sys.stderr)
    print(
        f"verified {report.verified} files ({report.bytes / 1e6:.1f} MB) strictly in {report.seconds:.1f} s; "
        f"{len(report.failed)} failed (left out); "
        + (f"{report.not_strict} not JPEG (decoded, not strictly: not verified); " if report.not_strict else "")
        + f"manifest: {report.manifest}"
    )
    return 1 if report.failed and not args.allow_bad else 0


def _measured() -> str:
    """What the calibration measured of the two libjpeg-turbo backends, if both ran."""
    from fastload.decode.costs import calibration_disabled, load_or_calibrate

    if os.environ.get("FASTLOAD_DECODER"):
        return " (FASTLOAD_DECODER)"
    if calibration_disabled():
        return ""
    us = load_or_calibrate().get("backend_us") or {}
    if len(us) < 2:
        return ""
    return " (full decode measured here: " + ", ".join(f"{k} {v:.0f} µs" for k, v in us.items()) + ")"


def build_parser() -> argparse.ArgumentParser:
    from fastload import __version__

    parser = argparse.ArgumentParser(prog="fastload", description="Fast image data loading for PyTorch.")
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="build a dataset of real photographs and measure the loader on it")
    demo.add_argument("--data", default="data/sample", help="where the sample dataset lives (default: %(default)s)")
    demo.add_argument("--images", type=int, default=400, help="photos to build (default: %(default)s)")
    demo.set_defaults(func=cmd_demo)
    info = sub.add_parser("info", help="show decoders, CPUs and GPU")
    info.set_defaults(func=cmd_info)
    verify = sub.add_parser(
        "verify",
        help="decode every image under DIR strictly and write a manifest of their checksums into it",
        description="Decodes every image file under DIR strictly and writes DIR/fastload-verified.json "
        "(relative path, size, mtime_ns, CRC32C, decoder, fastload version): ImageFolder and ImageList "
        "then decode a file whose bytes still have that checksum the cheapest way its crop allows, and "
        "refuse one whose bytes changed. Files that fail are listed and left out.",
        epilog="exit status: 0 all verified (or --allow-bad); 1 some files failed; 2 bad arguments",
    )
    verify.add_argument("dir", help="the image folder (an ImageFolder's or a list file's root)")
    verify.add_argument("--manifest", default=None, help="write the manifest here instead (a read-only DIR)")
    verify.add_argument("--workers", type=int, default=None, help="decoding threads (default: the CPUs available)")
    verify.add_argument("--allow-bad", action="store_true", help="exit 0 even if some files failed")
    verify.add_argument("--quiet", action="store_true", help="no progress bar")
    verify.set_defaults(func=cmd_verify)
    from fastload.tune import add_parser as add_tune

    add_tune(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, TypeError, ImportError) as e:
        print(f"fastload {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: said in a line, not a traceback; the shell's status for SIGINT
        print(f"\nfastload {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
