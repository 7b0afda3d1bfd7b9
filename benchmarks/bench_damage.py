"""Which damage each decode mode detects, on damaged real photographs.

The corpus (``damage.py``): scikit-image's colour photographs, each a baseline and a
progressive JPEG (quality 85-95, 4:2:0), cut short at many offsets through the scan data,
without its end-of-image marker, with bytes after it, and with 1-3 bytes changed in the
top, middle or bottom third of the scan data. Every file is decoded by every mode as
fastload runs it (the end-of-image check first, then the decoder); a mode *detects* a
file when it raises (a batched call: when it gives no pixels for it). The reference is
the full strict decode: a mode is safe only if it refuses every file that one refuses.

Modes: the full strict decode (simplejpeg, libjpeg's warnings as errors), libjpeg's own
check alone (no end-of-image walk), fast chroma upsampling, DCT scales 1/2, 1/4, 1/8
(strict), a region decode through nvImageCodec of a RandomResizedCrop box (one call per
image, and one call per batch), a region from the box's top to the image's bottom, the
strict region decode of TurboJPEG 3 (``TurboJPEGDecoder.decode_region``: the box's columns
from its top to the bottom, where the system libturbojpeg is libjpeg-turbo >= 3.0), and
Pillow's full decode (not strict) for comparison.

    python benchmarks/bench_damage.py            # the table (about a minute)
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable
from fractions import Fraction

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from common import parser, report  # noqa: E402
from damage import KINDS, corpus  # noqa: E402

from fastload.decode import get_decoder, read_header, roi  # noqa: E402
from fastload.decode.costs import region_box  # noqa: E402
from fastload.decode.header import check_jpeg_complete  # noqa: E402
from fastload.decode.resize import random_resized_crop  # noqa: E402

Mode = Callable[[bytes, tuple[int, int, int, int] | None], bool]  # (data, region) -> refused


def _refuses(fn: Callable[[], object]) -> bool:
    try:
        return fn() is None
    except Exception:  # DecodeError, and whatever a library raises on a file it cannot read
        return True


def modes() -> dict[str, Mode]:
    import simplejpeg
    from PIL import Image

    dec = get_decoder("simplejpeg")

    def strict(scale: Fraction = Fraction(1), fast: bool = False) -> Mode:
        return lambda d, _: _refuses(lambda: dec.decode(d, scale=scale, fast_upsample=fast))

    def pillow(d: bytes, _) -> bool:
        import io

        def run():
            with Image.open(io.BytesIO(d)) as img:
                img.load()
            return True

        return _refuses(run)

    out: dict[str, Mode] = {
        "full, strict (the reference)": strict(),
        "libjpeg's check alone (no EOI walk)": lambda d, _: _refuses(lambda: simplejpeg.decode_jpeg(d, strict=True)),
        "full, fast upsampling": strict(fast=True),
        "DCT scale 1/2": strict(Fraction(1, 2)),
        "DCT scale 1/4": strict(Fraction(1, 4)),
        "DCT scale 1/8": strict(Fraction(1, 8)),
    }
    if roi.available():
        rd = roi.get_region_decoder()

        def region(d: bytes, box) -> bool:
            return _refuses(lambda: (check_jpeg_complete(d), rd.decode(d, *box))[1])

        def to_bottom(d: bytes, box) -> bool:
            h = read_header(d).height
            return _refuses(lambda: (check_jpeg_complete(d), rd.decode(d, box[0], box[1], h, box[3]))[1])

        out["region, nvImageCodec, one call per image"] = region
        out["region from the crop's top to the bottom"] = to_bottom
    turbo3 = strict_region_decoder()
    if turbo3 is not None:

        def strict_region(d: bytes, box) -> bool:
            hd = read_header(d)
            return _refuses(lambda: turbo3.decode_region(d, hd, Fraction(1), box[0], box[1], box[3]))

        out["strict region, TurboJPEG 3 (crop's top to the bottom)"] = strict_region
    out["Pillow full decode (not strict)"] = pillow
    return out


def strict_region_decoder():
    """The system libturbojpeg's decoder where it is libjpeg-turbo >= 3.0, else None."""
    try:
        decoder = get_decoder("turbojpeg")
    except ImportError:
        return None
    return decoder if decoder.strict_regions else None


def batched(files: list[bytes], boxes: list) -> list[bool]:
    """Refused by the batched region path (fastload/sources/batchplan.py): cut short, or no pixels."""
    from fastload.sources.batchplan import complete

    rd = roi.get_region_decoder()
    whole = [j for j, d in enumerate(files) if complete(d)]
    got = rd.decode_batch([files[j] for j in whole], [boxes[j] for j in whole])
    refused = [True] * len(files)
    for j, px in zip(whole, got):
        refused[j] = px is None
    return refused


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--per-kind", type=int, default=12, help="damaged copies per kind of damage per encoding")
    args = p.parse_args()
    intact, damaged = corpus(per_kind=2 if args.quick else args.per_kind, photos=2 if args.quick else None)
    ms = modes()
    rng = np.random.default_rng(1)
    boxes = []
    for item in damaged:
        hd = read_header(intact[(item.photo, item.progressive)])
        crop = random_resized_crop(hd.height, hd.width, (224, 224), (0.08, 1.0), (3 / 4, 4 / 3), rng)
        boxes.append(region_box(hd, crop))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Intact files: every mode must accept them.
        false_alarms = {name: sum(m(d, (0, 0, 8, 8)) for d in intact.values()) for name, m in ms.items()}
        refused = {name: [m(item.data, box) for item, box in zip(damaged, boxes)] for name, m in ms.items()}
        if roi.available():
            refused["region, nvImageCodec, one call per batch"] = batched([i.data for i in damaged], boxes)
    ref = refused["full, strict (the reference)"]
    # (kind, progressive) -> files the reference refuses
    groups: dict[tuple[str, bool], list[int]] = defaultdict(list)
    for j, item in enumerate(damaged):
        groups[(item.kind, item.progressive)].append(j)
    cols = [(k, prog) for prog in (False, True) for k in KINDS]
    print(f"{len(damaged)} damaged files from {len(intact)} intact JPEGs ({len(intact) // 2} photos, baseline and "
          "progressive). Each cell: files the mode refuses / files the full strict decode refuses "
          "(trailing bytes: files refused of all, the reference refusing none); '!' marks a mode that lets "
          "through a file the reference refuses.\n")
    head = "| mode | " + " | ".join(f"{k}{', prog.' if p else ''}" for k, p in cols) + " | missed | intact refused |"
    print(head)
    print("|" + "---|" * (len(cols) + 3))
    record = {}
    for name, flags in refused.items():
        cells, missed = [], 0
        for col in cols:
            js = groups[col]
            bad = [j for j in js if ref[j]]
            if not bad:  # nothing to detect: count refusals of files the reference accepts
                cells.append(f"{sum(flags[j] for j in js)} of {len(js)}")
                continue
            hit = sum(flags[j] for j in bad)
            missed += len(bad) - hit
            cells.append(f"{hit}/{len(bad)}" + ("!" if hit < len(bad) else ""))
        alarms = false_alarms.get(name, 0)
        print(f"| {name} | " + " | ".join(cells) + f" | {missed} | {alarms} of {len(intact)} |")
        record[name] = {"missed": missed, "intact_refused": alarms}
    undetectable = sum(not r for r, item in zip(ref, damaged) if item.kind != "trailing bytes")
    print(f"\nDamaged files no mode can tell from intact ones (the reference accepts them: JPEG has no checksum): "
          f"{undetectable} of {sum(i.kind != 'trailing bytes' for i in damaged)}.")
    report("bench_damage", args, {"files": len(damaged), "modes": record})


if __name__ == "__main__":
    main()
