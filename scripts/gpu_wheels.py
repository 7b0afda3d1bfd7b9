"""Fills a folder (default .whl/) with the wheels the GPU check needs and the GPU machine lacks.

That machine (benchmarks/GPU.md) has Python 3.12, torch with CUDA 13, torchvision, timm,
OpenCV, Pillow, numpy, scikit-image, matplotlib, protobuf, tqdm and pytest, and no package
registry. What fastload needs beyond that travels as wheels for its Python and platform
(``make gpu-wheels``), versions from constraints.txt; pure-Python packages that PyPI has
only as source (tfrecord, PyTurboJPEG 1.x) are built into py3-none-any wheels here.
Refused: a carried package the image has (it would shadow the image's own, first on
PYTHONPATH), a Requires-Dist neither carried nor on the image, and the folder plus the
working tree over the 64 MiB a call may carry. No system library travels: fastload decodes
JPEG with simplejpeg's bundled libjpeg-turbo, as on any fresh machine.

    python scripts/gpu_wheels.py                          # the GPU machine: 3.12, CUDA 13
    python scripts/gpu_wheels.py --python 3.11 --dest D   # this machine's Python (the dry run)
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_MIB = 64  # what one device call may carry: working tree + carried folders
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
# name -> why it travels: fastload's dependencies the image lacks (protobuf and tqdm it has).
# {cuda} is the CUDA major version of the machine's torch.
CARRIED = {
    "lmdb": "LMDBDataset",
    "tfrecord": "TFRecord datasets (tf.train.Example parsing)",
    "crc32c": "TFRecord framing",
    "PyTurboJPEG": "a dependency of fastload (finds a system libturbojpeg, where there is one)",
    "simplejpeg": "the JPEG decoder with libjpeg-turbo inside",
    "nvidia-nvimgcodec-cu{cuda}": "GPU decode and region decode (nvImageCodec)",
    "nvidia-nvjpeg{suffix}": "nvImageCodec's nvJPEG extension (GPU JPEG decode)",
}
GPU_DECODE = ("nvidia-nvimgcodec-cu{cuda}", "nvidia-nvjpeg{suffix}")  # left out with --cuda none
# Older versions carried for benchmarks/gpu_decode_probe.py's comparison, each in a subfolder
# of its own (the GPU check installs only the folder's top level): subfolder -> (name, version).
# nvJPEG 13.0 refuses (or, told to, gets wrong) the edge of a region with fancy upsampling.
COMPARED = {"nvjpeg130": ("nvidia-nvjpeg", "13.0.4.44")}
# The GPU machine's Python packages (.library/device/KINDS.md, read 2026-11-17), lower case.
DEVICE_HAS = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: str) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by canonical name."""
    found = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                found[canonical(name)] = version.strip()
    return found


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def fetch(name: str, version: str, python: str, platforms: tuple[str, ...], dest: str) -> str:
    """The wheel of ``name==version`` for ``python`` and ``platforms`` in ``dest``: a
    binary wheel from the index, else one built here from its source (pure Python only)."""
    spec = f"{name}=={version}"
    plat = [a for p in platforms for a in ("--platform", p)]
    got = pip(
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        *plat,
        "--platform",
        "any",
        "-d",
        dest,
        spec,
    )
    if got.returncode != 0:
        built = pip("wheel", "-q", "--no-deps", "-w", dest, spec)
        if built.returncode != 0:
            raise SystemExit(
                f"gpu_wheels: no wheel of {spec} for Python {python} on {platforms[0]}, and building "
                f"one failed:\n{got.stderr[-1500:]}\n{built.stderr[-1500:]}"
            )
    wheel = newest(dest, name, version)
    if wheel is None:
        raise SystemExit(f"gpu_wheels: pip reported success but no wheel of {spec} is in {dest}")
    tag = os.path.basename(wheel).rsplit("-", 3)[1:]
    if got.returncode != 0 and tag[1:] != ["none", "any.whl"]:
        raise SystemExit(
            f"gpu_wheels: {spec} has no wheel for Python {python} and its source built a "
            f"platform wheel ({os.path.basename(wheel)}) that would not run there"
        )
    return wheel


def newest(dest: str, name: str, version: str) -> str | None:
    stem = re.sub(r"[-.]+", "_", name).lower()
    for path in glob.glob(os.path.join(dest, "*.whl")):
        base = os.path.basename(path).lower()
        if base.startswith(stem + "-" + version.lower() + "-"):
            return path
    return None


def shadowing(names) -> list[str]:
    """The names in ``names`` that the GPU machine's image has: carried, they would come first
    on PYTHONPATH and shadow its own."""
    return sorted(n for n in names if canonical(n) in DEVICE_HAS)


def requires(wheel: str) -> list[str]:
    """Requires-Dist names of ``wheel`` that apply on Linux without extras."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    names = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        marker = req.split(";", 1)[1] if ";" in req else ""
        if "extra" in marker or "Windows" in marker or "Darwin" in marker:
            continue
        names.append(canonical(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]))
    return names


def tree_bytes() -> int:
    """Bytes of the working tree that travels with every call (tracked + untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        os.path.getsize(os.path.join(ROOT, p.decode()))
        for p in listed
        if p and os.path.isfile(os.path.join(ROOT, p.decode()))
    )


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default="3.12", help="the target's Python, major.minor (default: 3.12)")
    p.add_argument(
        "--cuda",
        default="13",
        help="CUDA major version of the target's torch: picks "
        "nvidia-nvimgcodec-cu<N> (default: 13); 'none' leaves the GPU decode wheels out",
    )
    p.add_argument(
        "--platform",
        action="append",
        default=None,
        help="wheel platform tags to accept (repeatable; default: manylinux x86_64 2.5 to 2.28)",
    )
    p.add_argument("--dest", default=os.path.join(ROOT, ".whl"))
    p.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help="fail above this with the working tree")
    args = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python):
        p.error(f"--python must look like 3.12, got {args.python!r}")
    if args.cuda != "none" and not args.cuda.isdigit():
        p.error(f"--cuda must be a CUDA major version such as 13, or none; got {args.cuda!r}")
    platforms = tuple(args.platform or PLATFORMS)
    pinned = pins(os.path.join(ROOT, "constraints.txt"))
    suffix = "" if args.cuda == "none" or int(args.cuda) >= 13 else f"-cu{args.cuda}"  # nvJPEG's naming
    wanted = [n.format(cuda=args.cuda, suffix=suffix) for n in CARRIED if args.cuda != "none" or n not in GPU_DECODE]
    if shadowing(wanted):
        raise SystemExit(
            f"gpu_wheels: {', '.join(shadowing(wanted))}: the GPU machine has them, and carried they would shadow "
            "its own (first on PYTHONPATH): leave them out of CARRIED"
        )
    os.makedirs(args.dest, exist_ok=True)
    for old in glob.glob(os.path.join(args.dest, "*.whl")):  # one version of each: two stop the install
        os.remove(old)
    missing_pins = [n for n in wanted if canonical(n) not in pinned]
    if missing_pins:
        raise SystemExit(f"gpu_wheels: pin {', '.join(missing_pins)} in constraints.txt")
    wheels = {n: fetch(n, pinned[canonical(n)], args.python, platforms, args.dest) for n in wanted}
    carried = {canonical(n) for n in wanted}
    unmet = sorted(
        {f"{r} (for {n})" for n, w in wheels.items() for r in requires(w) if r not in carried and r not in DEVICE_HAS}
    )
    if unmet:
        raise SystemExit(
            f"gpu_wheels: needed but neither carried nor on the GPU machine: {', '.join(unmet)}; "
            "add them to CARRIED and constraints.txt"
        )
    shutil.rmtree(os.path.join(args.dest, "lib"), ignore_errors=True)  # what older versions carried
    compared = {}
    if args.cuda != "none" and int(args.cuda) >= 13:  # the compared wheels are CUDA 13 builds
        for folder, (name, version) in COMPARED.items():
            sub = os.path.join(args.dest, folder)
            shutil.rmtree(sub, ignore_errors=True)
            os.makedirs(sub)
            compared[folder] = fetch(name, version, args.python, platforms, sub)
    with open(os.path.join(args.dest, "MANIFEST"), "w") as f:
        f.write(f"python {args.python}\ncuda {args.cuda}\nplatforms {' '.join(platforms)}\n")
        f.writelines(f"wheel {os.path.basename(w)}\n" for w in wheels.values())
        f.writelines(f"compared {folder}/{os.path.basename(w)}\n" for folder, w in compared.items())
    carried_bytes, tree = folder_bytes(args.dest), tree_bytes()  # subfolders included
    total = (carried_bytes + tree) / 2**20
    for w in [*wheels.values(), *compared.values()]:
        print(f"  {os.path.getsize(w) / 2**20:6.2f} MiB  {os.path.relpath(w, args.dest)}")
    print(
        f"{args.dest}: {carried_bytes / 2**20:.1f} MiB for Python {args.python}, CUDA {args.cuda}; with the "
        f"working tree ({tree / 2**20:.1f} MiB) {total:.1f} MiB of the {args.limit_mib:.0f} MiB a call may carry"
    )
    if total > args.limit_mib:
        raise SystemExit(f"gpu_wheels: {total:.1f} MiB is over the {args.limit_mib:.0f} MiB limit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
