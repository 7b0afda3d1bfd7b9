"""A pip-only install against the full one: the train preset per sample, on the photo set.

Runs the same measurement in two Python environments at once, alternating passes:

* ``--full`` (default: this interpreter): the development install (``make``: the system
  libturbojpeg present, the ``[roi]`` extra installed);
* ``--pip-only``: an interpreter of a fresh venv made with only ``pip install .`` and the
  pinned requirements (``python -m venv /tmp/fresh && /tmp/fresh/bin/pip install -c
  constraints.txt .``), run with ``FASTLOAD_NO_SYSTEM_TURBOJPEG=1`` so that no system
  libturbojpeg loads. Without ``--pip-only`` this interpreter stands in, with the same
  switch (``--quick`` and the tests do that).

Region decode is off in both (``FASTLOAD_ROI=0``): the comparison is of the decoders a
plain ``pip install fastload`` brings. Each environment first reports its default
decoder, whether any fall-back warning was given, and that a damaged JPEG (entropy
bytes changed so that libjpeg warns) is a DecodeError naming the sample; then each pass
times ``ImageFolder.load`` (read, header, plan, decode, resize, flip) over the photos on
one thread, in CPU time. The ratio of the medians is printed: the target is >= 0.95.

With ``--busy-calibration`` both environments first calibrate their decode costs while
spinning processes keep every CPU busy (``busy_calibration.py``, into a cache folder of
this run's), and plan with what that calibration leaves them (issue 39: a calibration
made on a busy machine must not steer later runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def damage(data: bytes) -> bytes:
    """``data`` with entropy-coded bytes changed so that libjpeg warns (asked directly)."""
    import numpy as np
    import simplejpeg

    rng = np.random.default_rng(1)
    start = data.index(b"\xff\xda") + 20
    for _ in range(200):
        bad = bytearray(data)
        for pos in rng.integers(start, len(data) - 2, size=2):
            bad[pos] ^= int(rng.integers(1, 256))
        try:
            simplejpeg.decode_jpeg(bytes(bad), strict=True)
        except ValueError:
            return bytes(bad)
    raise RuntimeError("no damage libjpeg warns about")


def child(root: str, limit: int) -> None:
    """Reports the environment, then times one pass per line read from stdin."""
    import warnings

    import torch

    torch.set_num_threads(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import fastload as fl
        from fastload.decode import DecodeError, default_backend

        backend = default_backend()
        ds = fl.ImageFolder(root, transform=fl.transforms.train(224))
        ds.load(0)
    fallback = [str(w.message) for w in caught if "fastload" in str(w.message)]
    data = damage(ds.read(0)[0])

    class Damaged(fl.ImageFolder):
        def read(self, index):
            return data, 0

    try:
        Damaged(root, transform=fl.transforms.train(224)).load(0)
        damaged = "decoded without an error"
    except DecodeError as e:
        damaged = f"DecodeError: {str(e)[:160]}"
    n = min(len(ds), limit)
    print(json.dumps({"python": sys.executable, "decoder": backend, "warnings": fallback, "damaged": damaged,
                      "fastload": os.path.dirname(fl.__file__)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "pass":
            break
        start_t = time.thread_time()  # CPU time: other jobs on a shared machine do not count
        for i in range(n):
            ds.load(i, 1, 0)
        print(json.dumps({"us": (time.thread_time() - start_t) / n * 1e6}), flush=True)


def start(python: str, root: str, limit: int, pip_only: bool, cache: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "FASTLOAD_ROI": "0", **pip_only_env(pip_only)}
    if cache:
        env["FASTLOAD_CACHE_DIR"] = cache
    if pip_only and python != sys.executable:
        env.pop("PYTHONPATH", None)  # the fresh venv's own fastload, not this checkout's
    return subprocess.Popen([python, HERE, "--child", root, "--limit", str(limit)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd="/" if python != sys.executable else None)


def pip_only_env(pip_only: bool) -> dict:
    """The environment that makes ``python`` a pip-only install (none for the full one):
    no system libturbojpeg loads."""
    return {"FASTLOAD_NO_SYSTEM_TURBOJPEG": "1"} if pip_only else {}


def main() -> None:
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1], int(sys.argv[sys.argv.index("--limit") + 1]))
        return
    # Not at the top: common puts this checkout on sys.path, and a pip-only child must
    # import the fastload its venv installed.
    from common import median, parser, photo_folder, report

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--full", default=sys.executable, help="python of the full install")
    p.add_argument("--pip-only", default=None, help="python of a fresh venv with only `pip install .`")
    p.add_argument("--passes", type=int, default=7)
    p.add_argument("--limit", type=int, default=1000, help="photos per pass")
    p.add_argument("--busy-calibration", action="store_true",
                   help="both environments plan with a calibration made while every CPU was kept busy")
    args = p.parse_args()
    root = photo_folder(args)
    passes, limit = (1, 32) if args.quick else (args.passes, args.limit)
    pythons = {"full install": (args.full, False), "pip only": (args.pip_only or sys.executable, True)}
    cache = None
    if args.busy_calibration:
        import tempfile

        from busy_calibration import busy_calibration, describe

        cache = tempfile.mkdtemp(prefix="fastload-busy-cache-")
        for python, pip_only in pythons.values():
            print(describe(busy_calibration(cache, python, pip_only_env(pip_only))), flush=True)
    procs = {name: start(python, root, limit, pip_only, cache) for name, (python, pip_only) in pythons.items()}
    info = {name: json.loads(proc.stdout.readline()) for name, proc in procs.items()}
    for name, i in info.items():
        print(f"{name}: {i['python']} (fastload from {i['fastload']}): default decoder {i['decoder']}; "
              f"fall-back warnings: {i['warnings'] or 'none'}; damaged JPEG: {i['damaged']}")
    times: dict = {name: [] for name in procs}
    for _ in range(passes + 1):  # the first pass warms up (calibration, page cache)
        for name, proc in procs.items():
            proc.stdin.write("pass\n")
            proc.stdin.flush()
            times[name].append(json.loads(proc.stdout.readline())["us"])
    for proc in procs.values():
        proc.stdin.close()
        proc.wait(60)
    us = {name: median(t[1:]) for name, t in times.items()}
    ratio = us["full install"] / us["pip only"]
    print(f"train preset per sample ({limit} photos, one thread, region decode off, CPU µs, median of {passes} "
          f"alternating passes): full install {us['full install']:.0f} µs, pip only {us['pip only']:.0f} µs; "
          f"pip only runs at {ratio:.2f}x the full install's speed (target >= 0.95)")
    report("bench_pip_only", args, {"environments": info, "us_per_sample": us, "passes_us": times,
                                    "pip_only_speed_ratio": ratio, "photos": limit})


if __name__ == "__main__":
    main()
