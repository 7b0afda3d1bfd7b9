"""Decode rate per core on the real-photo dataset: each backend full and reduced, every
libjpeg-turbo DCT scale 1/8 … 8/8, the libjpeg-turbo bindings a pip install can bring
(simplejpeg, imagecodecs where importable, PyTurboJPEG over the system library), with and
without a reused output buffer, how strict each is on damaged photos, and the whole
per-sample pipeline in one process.

The decode limit is the cores in use × the one-core PyTurboJPEG full-decode rate on
these files. Rates are per CPU-second of the decoding thread (other jobs on a shared
machine do not count); passes are interleaved (every variant once per pass) and the
median pass is kept.
"""

from __future__ import annotations

import glob
import os
import time
from fractions import Fraction

import numpy as np
from common import median, parser, photo_folder, photo_set_record, report

import fastload as fl
from fastload.decode import BACKENDS, get_decoder
from fastload.system import available_cpus


def rates(variants: dict, count: int, passes: int) -> dict:
    """images per CPU-second of each ``variants[name]()`` (one pass over ``count`` images),
    median of ``passes`` after one untimed warm-up pass."""
    for run in variants.values():
        run()
    seconds: dict = {name: [] for name in variants}
    for _ in range(passes):
        for name, run in variants.items():
            start = time.thread_time()  # CPU time: other jobs on a shared machine do not count
            run()
            seconds[name].append(time.thread_time() - start)
    return {name: count / median(s) for name, s in seconds.items()}


def dct_scale_variants(blobs: list[bytes]) -> dict:
    """PyTurboJPEG decode to RGB at each scale n/8 (n = 1…8), whole image, no crop."""
    import turbojpeg

    tj = turbojpeg.TurboJPEG()
    scales = sorted(Fraction(n, d) for n, d in tj.scaling_factors if Fraction(n, d) <= 1)
    variants = {}
    for s in scales:
        factor = None if s == 1 else (s.numerator, s.denominator)
        variants[f"{s * 8}/8"] = (lambda f=factor: [tj.decode(b, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=f)
                                                   for b in blobs])
    return variants


def binding_variants(blobs: list[bytes]) -> dict:
    """Full decodes to RGB through each libjpeg-turbo binding importable here."""
    from fastload.decode import read_header
    from fastload.decode.libjpeg import scratch

    headers = [read_header(b) for b in blobs]
    variants = {}
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        variants["PyTurboJPEG (system libjpeg-turbo), new array"] = lambda: [
            tj.decode(b, pixel_format=turbojpeg.TJPF_RGB) for b in blobs]
    except (ImportError, OSError, RuntimeError) as e:
        print(f"PyTurboJPEG unavailable: {e}")
    import simplejpeg

    variants[f"simplejpeg {simplejpeg.__version__}, new array"] = lambda: [simplejpeg.decode_jpeg(b) for b in blobs]
    variants[f"simplejpeg {simplejpeg.__version__}, into a reused buffer"] = lambda: [
        simplejpeg.decode_jpeg(b, buffer=scratch(h.height * h.width * 3)) for b, h in zip(blobs, headers)]
    try:
        import imagecodecs

        variants[f"imagecodecs {imagecodecs.__version__} jpeg8_decode, new array"] = lambda: [
            imagecodecs.jpeg8_decode(b) for b in blobs]
    except ImportError:
        print("imagecodecs not importable: not measured")
    for name in ("simplejpeg", "turbojpeg"):
        try:
            dec = get_decoder(name)
        except ImportError:
            continue
        variants[f"fastload {name} backend, into the thread's buffer"] = lambda d=dec: [
            d.decode(b, header=h, out=scratch(h.height * h.width * 3)) for b, h in zip(blobs, headers)]
    return variants


def strictness(blobs: list[bytes], tries: int = 40) -> dict:
    """Of ``tries`` copies of a few photos with entropy-coded bytes changed, how many libjpeg
    warns about (PyTurboJPEG's warnings, else simplejpeg's strict mode), and how many of
    those each binding refuses (raises on)."""
    import warnings

    import simplejpeg

    def warned(data: bytes) -> bool:
        try:
            import turbojpeg

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                turbojpeg.TurboJPEG().decode(data)
            return bool(caught)
        except (ImportError, RuntimeError):
            try:
                simplejpeg.decode_jpeg(data, strict=True)
            except ValueError:
                return True
            return False
        except OSError:
            return True

    rng = np.random.default_rng(0)
    damaged = []
    for k in range(tries):
        data = bytearray(blobs[k % min(4, len(blobs))])
        start = data.index(b"\xff\xda") + 20
        for pos in rng.integers(start, len(data) - 2, size=2):
            data[pos] ^= int(rng.integers(1, 256))
        if warned(bytes(data)):
            damaged.append(bytes(data))
    bindings = {"simplejpeg (strict=True)": lambda b: simplejpeg.decode_jpeg(b, strict=True)}
    for name in ("simplejpeg", "turbojpeg", "opencv", "pillow"):
        try:
            bindings[f"fastload {name} backend"] = get_decoder(name).decode
        except ImportError:
            pass
    try:
        import imagecodecs

        bindings["imagecodecs jpeg8_decode"] = imagecodecs.jpeg8_decode
    except ImportError:
        pass
    refused = {}
    for name, fn in bindings.items():
        refused[name] = 0
        for data in damaged:
            try:
                fn(data)
            except Exception:  # noqa: BLE001 -- any refusal counts
                refused[name] += 1
    return {"damaged": len(damaged), "tries": tries, "refused": refused}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args()
    root = photo_folder(args)
    passes = 1 if args.quick else args.passes
    files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
    blobs = [open(f, "rb").read() for f in files]
    cores = available_cpus()

    backends = {}
    for name in BACKENDS:
        try:
            dec = get_decoder(name)
        except ImportError as e:
            print(f"{name:10s} unavailable: {e}")
            continue
        for label, scale in (("full", 1.0), ("reduced 1/2", 0.5), ("reduced 1/4", 0.25)):
            backends[f"{name} {label}"] = lambda d=dec, s=scale: [d.decode(b, s) for b in blobs]
    by_backend = rates(backends, len(blobs), passes)
    by_binding = rates(binding_variants(blobs), len(blobs), passes)
    try:
        by_scale = rates(dct_scale_variants(blobs), len(blobs), passes)
    except (ImportError, OSError, RuntimeError) as e:  # RuntimeError: PyTurboJPEG found no libturbojpeg
        print(f"PyTurboJPEG unavailable, no per-scale rates: {type(e).__name__}: {e}")
        by_scale = {}

    # The whole per-sample pipeline in one process: read + header + plan + decode + transform.
    pipelines = {}
    for name, tf in (("train 224", fl.transforms.train(224)), ("train 224 full decode",
                                                                fl.transforms.train(224, reduced_decode=False)),
                     ("eval 224", fl.transforms.eval(224)), ("eval 224 full decode",
                                                            fl.transforms.eval(224, reduced_decode=False))):
        ds = fl.ImageFolder(root, tf)
        pipelines[f"ImageFolder.load {name}"] = lambda d=ds: [d.load(i, 0, 0) for i in range(len(d))]
    by_pipeline = rates(pipelines, len(blobs), passes)

    full = by_scale.get("8/8") or by_backend.get("turbojpeg full") or max(
        v for k, v in by_backend.items() if k.endswith("full"))
    print(f"decode, {len(blobs)} photos, one thread, images per CPU-second (median of {passes} interleaved "
          "passes):")
    for key, rate in {**by_backend, **by_pipeline}.items():
        print(f"  {key:38s} {rate:8.0f}   ({rate / full:.2f}x a full PyTurboJPEG decode)")
    print("libjpeg-turbo bindings, full decode to RGB, images per CPU-second:")
    for key, rate in by_binding.items():
        print(f"  {key:58s} {rate:8.0f}   ({rate / full:.2f}x a full PyTurboJPEG decode)")
    strict = strictness(blobs)
    print(f"strictness: of {strict['tries']} photos with 2 entropy-coded bytes changed, libjpeg warns about "
          f"{strict['damaged']}; refused (raised) by:")
    for key, count in strict["refused"].items():
        print(f"  {key:58s} {count:4d} of {strict['damaged']}")
    if by_scale:
        print("PyTurboJPEG (libjpeg-turbo) whole-image decode at each DCT scale, images per CPU-second:")
        for key, rate in by_scale.items():
            print(f"  {key:5s} {rate:8.0f}   ({rate / full:.2f}x 8/8)")
    print(f"decode limit: {full:.0f} images/s/core x {cores} cores = {full * cores:.0f} images/s")
    report("bench_decode", args, {"images_per_s_per_core": {**by_backend, **by_pipeline}, "dct_scales": by_scale,
                                  "bindings": by_binding, "strictness": strict,
                                  "full_decode_per_core": full, "decode_limit": full * cores, "cores": cores,
                                  "dataset": photo_set_record(root)})


if __name__ == "__main__":
    main()
