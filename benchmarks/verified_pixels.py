"""How much a verified (cheapest-plan) decode changes a seeded Loader's batches against the strict one.

300 real photos (``tests/conftest.py``'s ``photo_jpegs``: scikit-image's photographs rescaled
to 256-512 pixels on the shorter side, JPEG quality 75-95) in an ImageFolder, verified with
``fastload verify``; one epoch of a seeded Loader (``train(224)``, shuffle, batch 50) with
``verified=True`` and ``verified=False``, compared image by image. Planned with the built-in
costs (``FASTLOAD_NO_CALIBRATION=1``, the same on every machine) and with this machine's
calibration. Needs nvImageCodec (``fastload[roi]``) for region decodes.

    python benchmarks/verified_pixels.py [--images 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def make_folder(root: str, images: int) -> None:
    from conftest import photo_jpegs

    blobs = photo_jpegs((256, 512), -(-images // 11), seed=0)[:images]
    for i, blob in enumerate(blobs):
        os.makedirs(os.path.join(root, f"c{i % 3}"), exist_ok=True)
        with open(os.path.join(root, f"c{i % 3}", f"{i:04d}.jpg"), "wb") as f:
            f.write(blob)


def epoch(root: str, verified: bool) -> tuple[np.ndarray, list[str]]:
    """The images of one seeded epoch, in index order, and the plan kind of each."""
    import fastload as fl

    ds = fl.ImageFolder(root, transform=fl.transforms.train(224), verified=verified)
    out = np.zeros((len(ds), 224, 224, 3), np.uint8)
    options = dict(batch_size=50, shuffle=True, seed=0, num_workers=0, device="cpu", return_index=True, normalize=False)
    with fl.Loader(ds, **options) as loader:
        for x, _, idx in loader:
            out[idx.numpy()] = x.permute(0, 2, 3, 1).numpy()
    kinds = [ds.plan(i).steps.plan.kind for i in range(len(ds))]
    return out, kinds


def compare(root: str) -> dict:
    strict, kinds_strict = epoch(root, False)
    cheap, kinds_verified = epoch(root, True)
    diff = np.abs(strict.astype(np.int16) - cheap).reshape(len(strict), -1)
    changed = diff.max(axis=1) > 0
    return {
        "images": len(strict),
        "region plans": sum(k == "region" for k in kinds_verified),
        "plans changed": sum(a != b for a, b in zip(kinds_strict, kinds_verified)),
        "images changed": int(changed.sum()),
        "max level difference": int(diff.max()),
        "mean abs difference over changed images": float(diff[changed].mean()) if changed.any() else 0.0,
        "mean abs difference over all": float(diff.mean()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--child", choices=["builtin", "calibrated"], help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(args.child, compare(args.root), flush=True)
        return
    from fastload.cli import main as cli

    with tempfile.TemporaryDirectory() as root:
        make_folder(root, args.images)
        assert cli(["verify", root, "--quiet"]) == 0
        for costs in ("builtin", "calibrated"):
            env = {k: v for k, v in os.environ.items() if k not in ("FASTLOAD_ROI", "FASTLOAD_NO_CALIBRATION")}
            if costs == "builtin":
                env["FASTLOAD_NO_CALIBRATION"] = "1"
            cmd = [sys.executable, __file__, "--child", costs, "--root", root]
            subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
