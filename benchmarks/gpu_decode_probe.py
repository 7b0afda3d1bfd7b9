"""The GPU decode ceiling: nvImageCodec's pure decode throughput on JPEG bytes in memory.

One process, one device call (the GPU check's ``probe`` step, or alone), at most --budget
seconds (a hard deadline stops it and still prints the table). The photos are read into
memory first; then, for each configuration, batches of 256 are decoded, CUDA-synchronized,
the warm-up batch dropped, >= 3 timed repeats (images/s min / median / max):

- backends: the hardware JPEG engines (HW_GPU_ONLY), CUDA (GPU_ONLY), hybrid
  (HYBRID_CPU_GPU), each alone, and all three in fastload's order;
- fancy upsampling on / off; whole images / RandomResizedCrop regions (fixed seed, a region
  where the crop covers under half the image, as fastload plans), as fastload asks for them
  on this nvJPEG ("region": plain on >= 13.2, padded by one MCU before) and both ways
  explicitly, each checked against the whole decode's cut (max difference, rows differing);
- 1, 2, 4 Python threads, each with its own Decoder and CUDA stream, on different batches
  (aggregate images/s); max_num_cpu_threads 0 against 4; with / without preallocation hints.

It prints the nvJPEG it loaded (the path from /proc/self/maps, the version nvjpegGetProperty
gives) and nvImageCodec's version. ``--nvjpeg-site DIR`` (an nvJPEG wheel installed there)
loads that nvJPEG before nvImageCodec does: nvImageCodec's extension dlopens
``libnvjpeg.so.<CUDA major>`` (found by its RUNPATH next to the nvImageCodec wheel), and a
library already loaded under that soname is the one dlopen returns. ``--compare-wheels DIR``
(scripts/gpu_wheels.py puts nvJPEG 13.0 in .whl/nvjpeg130) installs the wheels of DIR into a
private folder and runs a few configurations again in a child process with it, within the
same budget. A JSON line per measurement goes to --json; every configuration runs in a try
that records its error and goes on.

    python benchmarks/gpu_decode_probe.py --photos data/gpu-photos-8192 --json probe.jsonl
    python benchmarks/gpu_decode_probe.py --make-photos 2048 --compare-wheels .whl/nvjpeg130
    python benchmarks/gpu_decode_probe.py --dry-run --photos DIR   # the CPU backend, tiny
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

BACKENDS = {
    "hw": ("HW_GPU_ONLY",),
    "cuda": ("GPU_ONLY",),
    "hybrid": ("HYBRID_CPU_GPU",),
    "all": ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU"),
}
HARD_GRACE_S = 5  # past the budget: the watchdog prints what there is and ends the process
HARD_EXIT = 124  # as timeout(1) says it (the GPU check shows TIME)


@dataclass(frozen=True)
class Config:
    """One measured configuration."""

    backends: str = "all"  # a key of BACKENDS
    fancy: bool = True
    regions: str = "whole"  # whole, region (fastload's choice for this nvJPEG), plain, padded
    threads: int = 1  # Python threads, each with its own Decoder and stream
    cpu_threads: int = 4  # nvImageCodec's max_num_cpu_threads (0: one per core)
    prealloc: bool = True

    @property
    def name(self) -> str:
        return (f"{self.backends}/{self.regions}/fancy{int(self.fancy)}/t{self.threads}/cpu{self.cpu_threads}"
                f"/{'prealloc' if self.prealloc else 'noprealloc'}")


def plan(subset: str) -> list[Config]:
    """The configurations, most telling first: one factor at a time from fastload's set-up."""
    base = Config()
    if subset == "compare":  # the child on the other nvJPEG: what its version changes
        return [base, replace(base, regions="region"), replace(base, regions="plain"),
                replace(base, regions="padded"), replace(base, backends="hw", regions="region"),
                replace(base, regions="region", fancy=False)]
    out = [base, replace(base, regions="region")]
    for b in ("hw", "cuda", "hybrid"):
        out += [replace(base, backends=b), replace(base, backends=b, regions="region")]
    out += [replace(base, regions="plain"), replace(base, regions="padded"),
            replace(base, fancy=False), replace(base, fancy=False, regions="region"),
            replace(base, threads=2), replace(base, threads=4), replace(base, threads=4, regions="region"),
            replace(base, cpu_threads=0), replace(base, prealloc=False)]
    return out


def preload_nvjpeg(site: str) -> str:
    """Loads the libnvjpeg installed under ``site`` (before nvImageCodec loads one); its path.

    Raises:
        FileNotFoundError: No libnvjpeg under ``site`` (names it).
    """
    found = sorted(glob.glob(os.path.join(site, "**", "libnvjpeg.so*"), recursive=True))
    if not found:
        raise FileNotFoundError(f"no libnvjpeg.so* under --nvjpeg-site {site}")
    ctypes.CDLL(found[0], mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    return found[0]


def read_photos(args: argparse.Namespace) -> list[bytes]:
    """The JPEG bytes of --photos (every *.jpg below it, sorted), or of a set built by
    gpu_photos.py with --make-photos N under --data; at most --images of them."""
    root = args.photos
    if root is None:
        import gpu_photos

        n = args.make_photos or 32
        root = gpu_photos.build(os.path.join(args.data, f"gpu-photos-{n}"), n, workers=2 if args.dry_run else None)
    paths = sorted(glob.glob(os.path.join(root, "**", "*.jp*g"), recursive=True))[: args.images]
    if not paths:
        raise SystemExit(f"gpu_decode_probe: no JPEG under {root}")
    out = []
    for path in paths:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def rrc_region(rng: Any, height: int, width: int) -> tuple[int, int, int, int] | None:
    """A RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3) box (y0, x0, y1, x1), or None where it
    covers half the image or more (fastload decodes those whole: REGION_MAX_AREA)."""
    from fastload.device.gpudecode import REGION_MAX_AREA

    area = height * width
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            y0, x0 = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            return (y0, x0, y0 + h, x0 + w) if h * w < REGION_MAX_AREA * area else None
    return None


class Probe:
    """Decoders, batches and the measurements of one process."""

    def __init__(self, args: argparse.Namespace, data: list[bytes], deadline: float) -> None:
        import numpy as np
        import torch

        from fastload.decode import roi
        from fastload.device.gpudecode import nvdecode

        self.args, self.deadline, self.torch, self.nvdecode = args, deadline, torch, nvdecode
        self.nv = roi.module()  # PYNVIMGCODEC_VERBOSITY=1 unless set: no warning per refused row
        self.cuda = torch.cuda.is_available() and not args.dry_run
        self.batch = args.batch
        nv, rng = self.nv, np.random.default_rng(0)
        self.sizes = []
        for b in data:
            s = nv.CodeStream(b)
            self.sizes.append((int(s.height), int(s.width)))
        self.regions = [rrc_region(rng, h, w) for h, w in self.sizes]
        self.data = data
        self.batches = [list(range(i, i + self.batch)) for i in range(0, len(data) - self.batch + 1, self.batch)]
        if not self.batches:
            raise SystemExit(f"gpu_decode_probe: {len(data)} photos, fewer than a batch of {self.batch}")
        self.nvjpeg = nvdecode.nvjpeg_version()
        self.nvjpeg_path = nvdecode.loaded_nvjpeg()
        self.mode = nvdecode.region_mode(self.nvjpeg) if self.cuda else "plain"
        self.params = nv.DecodeParams(apply_exif_orientation=False)
        median = sorted(self.sizes)[len(self.sizes) // 2]
        self.size_hint = median

    def decoder(self, cfg: Config) -> Any:
        nv, nvdecode = self.nv, self.nvdecode
        if not self.cuda:  # the dry run: the CPU backend stands in for every backend set
            return nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=cfg.cpu_threads,
                              backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
                              options=f":fancy_upsampling={int(cfg.fancy)}")
        options = nvdecode.decoder_options(self.batch, self.size_hint, fancy=cfg.fancy)
        if not cfg.prealloc:
            options = " ".join(o for o in options.split() if ":preallocate_" not in o)
        return nv.Decoder(device_id=self.torch.cuda.current_device(), max_num_cpu_threads=cfg.cpu_threads,
                          backends=nvdecode.gpu_backends(nv, BACKENDS[cfg.backends]), options=options)

    def asked(self, i: int, regions: str) -> tuple[int, int, int, int] | None:
        region = self.regions[i]
        mode = self.mode if regions == "region" else regions
        if region is None or mode == "whole":
            return None
        if mode == "plain":
            return region
        h, w = self.sizes[i]
        grown = self.nvdecode.padded(region, h, w)
        return None if grown == (0, 0, h, w) else grown

    def streams(self, batch: list[int], regions: str) -> list[Any]:
        nv, out = self.nv, []
        for i in batch:
            s = nv.CodeStream(self.data[i])
            ask = self.asked(i, regions)
            if ask is not None:
                s = s.get_sub_code_stream(region=nv.Region(start=ask[:2], end=ask[2:]))
            out.append(s)
        return out

    def measure(self, cfg: Config) -> dict:
        """images/s of ``cfg`` (min, median, max over the repeats), rows refused, and for
        regions the difference from the whole decode's cut."""
        torch = self.torch
        decoders = [self.decoder(cfg) for _ in range(cfg.threads)]
        cuda_streams = [torch.cuda.Stream() for _ in decoders] if self.cuda else [None] * cfg.threads
        refused = [0] * cfg.threads
        per_thread = max(1, min(self.args.per_repeat, len(self.batches) // cfg.threads))

        def work(t: int, which: list[list[int]]) -> None:
            keep = []
            for batch in which:
                stream = cuda_streams[t]
                images = decoders[t].decode(self.streams(batch, cfg.regions), params=self.params,
                                            cuda_stream=stream.cuda_stream if stream is not None else 0)
                refused[t] += sum(img is None for img in images)
                keep.append(images)  # alive until the device is synchronized
            if self.cuda:
                cuda_streams[t].synchronize()

        def run(rep: int) -> float:
            threads = []
            for t in range(cfg.threads):  # different batches per thread and per repeat
                first = (rep * cfg.threads + t) * per_thread
                which = [self.batches[(first + k) % len(self.batches)] for k in range(per_thread)]
                threads.append(threading.Thread(target=work, args=(t, which), daemon=True))
            start = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            if self.cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - start

        run(0)  # warm-up: pools, streams, the hardware engines' first use
        refused_warmup = sum(refused)
        rates, began = [], time.monotonic()
        for rep in range(1, self.args.repeats + 1):
            if rep > 3 and (time.monotonic() - began > self.args.config_s or time.monotonic() > self.deadline):
                break
            if rep > 1 and time.monotonic() > self.deadline:
                break
            rates.append(cfg.threads * per_thread * self.batch / run(rep))
        out: dict[str, Any] = {
            "images_per_s": {"min": min(rates), "median": statistics.median(rates), "max": max(rates)},
            "repeats": len(rates), "images_per_repeat": cfg.threads * per_thread * self.batch,
            "refused_per_batch": (sum(refused) - refused_warmup) / max(1, len(rates) * cfg.threads * per_thread),
            "region_rows": sum(self.asked(i, cfg.regions) is not None for b in self.batches for i in b)
            / (len(self.batches) * self.batch),
        }
        if cfg.regions != "whole":
            out["exact"] = self.exactness(cfg, decoders[0])
        return out

    def exactness(self, cfg: Config, decoder: Any) -> dict:
        """Rows of the first batch whose region cut differs from the whole decode's (same
        decoder), and the largest difference in levels."""
        import numpy as np

        torch, batch = self.torch, self.batches[0]
        got = decoder.decode(self.streams(batch, cfg.regions), params=self.params)
        whole = decoder.decode(self.streams(batch, "whole"), params=self.params)
        if self.cuda:
            torch.cuda.synchronize()
        worst, differ, compared = 0, 0, 0
        for i, a, w in zip(batch, got, whole):
            region, ask = self.regions[i], self.asked(i, cfg.regions)
            if region is None or ask is None or a is None or w is None:
                continue
            ta = torch.from_dlpack(a) if self.cuda else torch.from_numpy(np.asarray(a))
            tw = torch.from_dlpack(w) if self.cuda else torch.from_numpy(np.asarray(w))
            y0, x0, y1, x1 = region
            cut_a = ta[y0 - ask[0] : y1 - ask[0], x0 - ask[1] : x1 - ask[1]].int()
            diff = int((cut_a - tw[y0:y1, x0:x1].int()).abs().max())
            worst, differ, compared = max(worst, diff), differ + (diff > 0), compared + 1
        return {"rows": compared, "differ": differ, "max_diff": worst}


class Report:
    """The JSON lines and the table, written as measurements come (the watchdog's too)."""

    def __init__(self, path: str | None, tag: dict) -> None:
        self.path, self.tag, self.rows, self.lock = path, tag, [], threading.Lock()

    def add(self, record: dict) -> None:
        record = {"benchmark": "gpu_decode_probe", **self.tag, **record}
        with self.lock:
            self.rows.append(record)
            if self.path:
                with open(self.path, "a") as f:
                    f.write(json.dumps(record) + "\n")
        if "config" in record:
            print(line(record), flush=True)

    def table(self, extra: list[dict] = ()) -> str:
        with self.lock:
            rows = [r for r in [*self.rows, *extra] if "config" in r]
        head = f"{'nvJPEG':>8}  {'configuration':<44} {'min':>7} {'median':>7} {'max':>7}  n  refused  exact"
        return "\n".join(["gpu_decode_probe: images/s, batches of 256 in memory, CUDA-synchronized", head,
                          *(line(r) for r in rows)])


def line(r: dict) -> str:
    name = f"{r.get('nvjpeg') or '?':>8}  {r['config']:<44}"
    if r.get("error"):
        return f"{name} ERROR {r['error'][:120]}"
    if r.get("skipped"):
        return f"{name} skipped: {r['skipped']}"
    ips, ex = r["images_per_s"], r.get("exact")
    exact = f"  {ex['differ']}/{ex['rows']} differ, max {ex['max_diff']}" if ex else ""
    return (f"{name} {ips['min']:7.0f} {ips['median']:7.0f} {ips['max']:7.0f} {r['repeats']:2d} "
            f"{r['refused_per_batch']:7.1f}{exact}")


def compare(args: argparse.Namespace, report: Report, deadline: float) -> list[dict]:
    """The child run on the wheels of --compare-wheels (installed into a private folder): its
    records, read back from its JSON lines."""
    left = deadline - time.monotonic()
    wheels = sorted(glob.glob(os.path.join(args.compare_wheels, "*.whl")))
    if not wheels or left < 12:
        why = "no wheels" if not wheels else f"{left:.0f} s left"
        report.add({"compare": args.compare_wheels, "skipped": why})
        return []
    site = tempfile.mkdtemp(prefix="nvjpeg-site-")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--target", site, *wheels], capture_output=True, text=True, timeout=max(5, left / 3))
    if pip.returncode != 0:
        report.add({"compare": args.compare_wheels, "error": f"pip install failed: {pip.stderr.strip()[-300:]}"})
        return []
    out = os.path.join(site, "probe.jsonl")
    left = deadline - time.monotonic()
    argv = [sys.executable, __file__, "--subset", "compare", "--nvjpeg-site", site, "--json", out,
            "--budget", f"{max(5.0, left - HARD_GRACE_S - 2):.1f}", "--batch", str(args.batch),
            "--images", str(args.images), "--repeats", str(args.repeats), "--per-repeat", str(args.per_repeat),
            "--photos", args.photos_dir, *(["--dry-run"] * args.dry_run)]
    try:
        child = subprocess.run(argv, capture_output=True, text=True, timeout=max(5.0, left))
        sys.stdout.write(child.stdout[-4000:])
        if child.returncode != 0:
            report.add({"compare": args.compare_wheels, "error": f"exit {child.returncode}: "
                        f"{(child.stderr or child.stdout).strip()[-300:]}"})
    except subprocess.TimeoutExpired:
        report.add({"compare": args.compare_wheels, "error": "the child ran past the budget"})
    records = []
    if os.path.exists(out):
        with open(out) as f:
            records = [json.loads(x) for x in f if x.strip()]
    if report.path:
        with open(report.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--photos", help="a folder of JPEGs (every *.jpg below it)")
    p.add_argument("--make-photos", type=int, default=0, help="build N photos with gpu_photos.py under --data")
    p.add_argument("--data", default=os.path.join(ROOT, "data"))
    p.add_argument("--images", type=int, default=2048, help="photos read into memory (default 2048)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats at most (at least 3 while time is left)")
    p.add_argument("--per-repeat", type=int, default=2, help="batches per thread in a repeat")
    p.add_argument("--config-s", type=float, default=3.0, help="seconds a configuration repeats for past 3")
    p.add_argument("--budget", type=float, default=85.0, help="seconds for the whole run (hard deadline + 5)")
    p.add_argument("--json", help="a JSON line per measurement, appended")
    p.add_argument("--nvjpeg-site", help="load the libnvjpeg installed under DIR before nvImageCodec does")
    p.add_argument("--compare-wheels", help="run again on the nvJPEG wheels in DIR (a child, in the budget)")
    p.add_argument("--subset", default="all", choices=("all", "compare"), help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="the CPU backend, tiny sizes (tests)")
    args = p.parse_args(argv)
    if args.dry_run:
        args.batch, args.images, args.repeats, args.per_repeat = min(args.batch, 4), min(args.images, 8), 3, 1
    start = time.monotonic()
    deadline = start + args.budget
    preloaded = preload_nvjpeg(args.nvjpeg_site) if args.nvjpeg_site else None  # before nvImageCodec loads one
    report = Report(args.json, {})
    done = threading.Event()

    def hard_stop() -> None:  # a decode stuck in C: the table of what was measured, then out
        if not done.is_set():
            report.add({"stopped": f"hard deadline {args.budget + HARD_GRACE_S:.0f} s"})
            print(report.table(), flush=True)
            os._exit(HARD_EXIT)

    watchdog = threading.Timer(args.budget + HARD_GRACE_S, hard_stop)
    watchdog.daemon = True
    watchdog.start()
    data = read_photos(args)
    args.photos_dir = args.photos or os.path.join(args.data, f"gpu-photos-{args.make_photos or 32}")
    probe = Probe(args, data, deadline)
    nvjpeg = ".".join(map(str, probe.nvjpeg)) if probe.nvjpeg else None
    report.tag = {"nvjpeg": nvjpeg}
    import torch

    setup = {"setup": {"nvimgcodec": probe.nv.__version__, "nvjpeg": nvjpeg, "nvjpeg_path": probe.nvjpeg_path,
                       "preloaded": preloaded, "region_mode": probe.mode, "cuda": probe.cuda,
                       "device": torch.cuda.get_device_name() if probe.cuda else "cpu (dry run)",
                       "images": len(data), "batch": args.batch, "size_hint": probe.size_hint,
                       "region_rows": sum(r is not None for r in probe.regions) / len(data)}}
    if preloaded and probe.nvjpeg_path and os.path.realpath(probe.nvjpeg_path) != os.path.realpath(preloaded):
        setup["setup"]["error"] = f"preloaded {preloaded} but nvImageCodec uses {probe.nvjpeg_path}"
    report.add(setup)
    print(f"gpu_decode_probe: nvImageCodec {probe.nv.__version__}, nvJPEG {nvjpeg} from {probe.nvjpeg_path}; "
          f"regions asked {probe.mode}; {setup['setup']['device']}; {len(data)} photos in memory, "
          f"{len(probe.batches)} batches of {args.batch}; {time.monotonic() - start:.1f} s to start", flush=True)
    reserve = 25 if args.compare_wheels and not args.dry_run else 0  # the child's share of the budget
    for cfg in plan(args.subset):
        record: dict[str, Any] = {"config": cfg.name, **asdict(cfg)}
        if time.monotonic() > deadline - reserve - 1:
            record["skipped"] = "deadline"
        else:
            try:
                record.update(probe.measure(cfg))
            except Exception as e:  # recorded; the next configuration runs
                record["error"] = f"{type(e).__name__}: {e}"
        report.add(record)
    extra = compare(args, report, deadline) if args.compare_wheels else []
    done.set()
    print(report.table(extra), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
