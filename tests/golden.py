"""Batches of a few Loader configurations, as digests: the reference the redesign keeps (issue 33).

Each configuration writes its small dataset (deterministic JPEGs, converted where the format
needs it), runs a Loader over it for two epochs (or a resumed pass) and records every batch:
its epoch, sample indices, targets, skipped samples, and a digest and mean of its pixels.
``tests/golden_batches.json`` holds these records as the old main produced them;
``tests/test_golden_batches.py`` compares the current code with them.

Run ``python tests/golden.py --write`` (on the code whose batches are the reference) to
write the file again; ``--only NAME`` for one configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "golden_batches.json")

#: What makes pixels depend on this machine is fixed: the planner's built-in costs (no
#: calibration), simplejpeg (no system libturbojpeg), caches in the test's own folder.
ENV = {"FASTLOAD_NO_CALIBRATION": "1", "FASTLOAD_NO_SYSTEM_TURBOJPEG": "1", "FASTLOAD_GPU_DECODE_ON_CPU": "1"}
UNSET = ("FASTLOAD_DECODER", "FASTLOAD_ROI")

BASE = dict(batch_size=5, device="cpu", normalize=False, return_index=True, seed=7, stall_warning=0)


# ---- the data ---------------------------------------------------------------------------------


def _jpeg(img: np.ndarray, quality: int = 90) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _image(seed: int, h: int, w: int) -> np.ndarray:
    from fastload.photos.jpegs import photo_like

    rng = np.random.default_rng(seed)
    return photo_like(rng, h, w, rng.uniform(-1, 1, 3))


def write_folder(root: str, classes: int = 3, per_class: int = 8, size: tuple[int, int] = (72, 96)) -> str:
    """root/c<k>/<i>.jpg of varied sizes around ``size``."""
    for c in range(classes):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
        for i in range(per_class):
            k = c * 1000 + i
            h, w = size[0] + (k * 7) % 40, size[1] + (k * 13) % 50
            with open(os.path.join(root, f"c{c}", f"{i:03d}.jpg"), "wb") as f:
                f.write(_jpeg(_image(k, h, w)))
    return root


def damage(root: str) -> None:
    """Two bad samples: one file cut short, one that is not an image."""
    path = os.path.join(root, "c1", "002.jpg")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 3])
    with open(os.path.join(root, "c2", "005.jpg"), "wb") as f:
        f.write(b"not an image at all")


SOURCES = ("folder", "big", "shards")  # what a configuration writes itself (not converted: LMDB pages vary)


def digest_tree(root: str) -> str:
    """The source files under ``root`` (names and bytes), hashed: the configuration's input."""
    paths = []
    for top in SOURCES:
        for folder, _, files in os.walk(os.path.join(root, top)):
            paths += [os.path.join(folder, name) for name in files]
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def write_shards(root: str, counts: tuple[int, ...] = (7, 5, 8, 4), size: tuple[int, int] = (60, 80)) -> str:
    """WebDataset shards: sample n is key s<n>, a JPEG and the target n % 5."""
    import io
    import tarfile

    os.makedirs(root, exist_ok=True)
    n = 0
    for s, count in enumerate(counts):
        with tarfile.open(os.path.join(root, f"shard-{s:06d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(count):
                for ext, data in (
                    ("jpg", _jpeg(_image(5000 + n, size[0] + n % 9, size[1] + n % 11))),
                    ("cls", str(n % 5).encode()),
                ):
                    info = tarfile.TarInfo(f"s{n:05d}.{ext}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o644
                    tar.addfile(info, io.BytesIO(data))
                n += 1
    return root


class UserDataset(torch.utils.data.Dataset):
    """A user's own map-style dataset: PIL images from a folder, numpy targets of two values."""

    def __init__(self, root: str) -> None:
        self.files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Image.Image, np.ndarray]:
        img = Image.open(self.files[i]).convert("RGB").resize((40, 32))
        return img, np.array([i % 3, i * 0.5], dtype=np.float32)


class ArrayDataset(torch.utils.data.Dataset):
    """Another: uint8 tensors C×H×W and int targets, no files at all."""

    def __len__(self) -> int:
        return 17

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(i)
        return torch.from_numpy(rng.integers(0, 256, (3, 24, 20), dtype=np.uint8)), i % 4


# ---- the configurations -----------------------------------------------------------------------


@dataclass
class Config:
    """A Loader over a dataset made in a folder; ``run`` yields what the test records."""

    name: str
    make: Callable[[str], Any]  # folder -> dataset
    options: dict = field(default_factory=dict)
    run: str = "epochs"  # "epochs": two passes; "resume": a state saved mid-epoch, resumed by another Loader
    resumed: dict = field(default_factory=dict)  # the resuming Loader's options (over ``options``)
    env: dict = field(default_factory=dict)  # environment variables of its run (over ENV)


def _folder(root: str, **kw: Any) -> str:
    return write_folder(os.path.join(root, "folder"), **kw)


def _train(size: int = 32, **kw: Any) -> Any:
    import fastload as fl

    return fl.transforms.train(size, **kw)


def _eval(size: int = 32) -> Any:
    import fastload as fl

    return fl.transforms.eval(size, resize=40)


def _image_folder(
    transform: Callable[[], Any] = _train, damaged: bool = False, decoder: str | None = None
) -> Callable[[str], Any]:
    def make(root: str) -> Any:
        import fastload as fl

        path = _folder(root)
        if damaged:
            damage(path)
        return fl.ImageFolder(path, transform=transform(), decoder=decoder)

    return make


def _converted(fmt: str, cls: str, transform: Callable[[], Any] = _train, **open_kw: Any) -> Callable[[str], Any]:
    def make(root: str) -> Any:
        import fastload as fl
        from fastload.convert import convert

        dst = os.path.join(root, fmt)
        convert(_folder(root), dst + (".lmdb" if fmt == "lmdb" else ""), fmt, shards=2, workers=1, progress=False)
        path = dst + ".lmdb" if fmt == "lmdb" else dst
        return getattr(fl, cls)(path, transform=transform(), **open_kw)

    return make


def _webdataset(transform: Callable[[], Any] = _train) -> Callable[[str], Any]:
    def make(root: str) -> Any:
        import fastload as fl

        return fl.WebDataset(write_shards(os.path.join(root, "shards")), transform=transform())

    return make


def _multiview(root: str) -> Any:
    import fastload as fl
    from fastload import transforms as T

    views = T.MultiView([T.train(32, scale=(0.4, 1.0)), T.train(16, scale=(0.05, 0.4))], counts=[2, 3])
    return fl.ImageFolder(_folder(root), transform=views)


def _subset(root: str) -> Any:
    import fastload as fl

    ds = fl.ImageFolder(_folder(root), transform=_train())
    return torch.utils.data.Subset(ds, list(range(23, 0, -2)))


def _user(root: str) -> Any:
    import fastload as fl

    return fl.WrappedDataset(UserDataset(_folder(root)), transform=[fl.transforms.RandomHorizontalFlip()])


def _region(root: str) -> Any:
    """Larger photos with small crops: the planner picks region decodes (batched in a batch)."""
    import fastload as fl

    path = write_folder(os.path.join(root, "big"), classes=2, per_class=8, size=(480, 640))
    return fl.ImageFolder(path, transform=fl.transforms.train(32, scale=(0.02, 0.08)))


def _gpu_ready(root: str) -> Any:
    import fastload as fl

    return fl.ImageFolder(_folder(root), transform=fl.transforms.train(32))


def _streams(kind: str) -> Callable[[str], Any]:
    def make(root: str) -> Any:
        import fastload as fl
        from fastload.convert import convert

        dst = os.path.join(root, "records")
        convert(_folder(root), dst, "tfrecord", shards=3, workers=1, progress=False)
        return fl.TFRecordStream(dst, transform=_eval())

    return make


TRAIN = dict(shuffle=True)
TRUSTED = {"FASTLOAD_ROI": "trusted"}
PROC2 = dict(backend="process", num_workers=2)
THREAD2 = dict(backend="thread", num_workers=2)

CONFIGS = [
    Config("folder-process-w0", _image_folder(), dict(TRAIN, backend="process", num_workers=0)),
    Config("folder-process-w2", _image_folder(), dict(TRAIN, **PROC2)),
    Config("folder-thread-w2", _image_folder(), dict(TRAIN, **THREAD2)),
    Config("folder-thread-w1-eval", _image_folder(_eval), dict(backend="thread", num_workers=1)),
    Config("folder-process-w2-eval-droplast", _image_folder(_eval), dict(PROC2, drop_last=True)),
    Config("folder-normalized-w0", _image_folder(), dict(TRAIN, num_workers=0, normalize=True)),
    Config("folder-rank1of2-thread", _image_folder(), dict(TRAIN, **THREAD2, rank=1, world_size=2)),
    Config(
        "folder-rank0of2-process-unpadded",
        _image_folder(),
        dict(TRAIN, **PROC2, rank=0, world_size=2, drop_uneven=True),
    ),
    Config("folder-full-decode", _image_folder(lambda: _train(reduced_decode=False)), dict(TRAIN, **PROC2)),
    Config("folder-pillow-thread", _image_folder(decoder="pillow"), dict(TRAIN, **THREAD2)),
    Config("folder-opencv-process", _image_folder(_eval, decoder="opencv"), dict(PROC2)),
    Config("region-process-w2", _region, dict(TRAIN, **PROC2)),
    Config("region-thread-w2", _region, dict(TRAIN, **THREAD2)),
    Config("region-process-w0", _region, dict(TRAIN, num_workers=0)),
    # Files trusted intact: region decodes planned, a batch's decoded in one call.
    Config("region-trusted-process-w2", _region, dict(TRAIN, **PROC2), env=TRUSTED),
    Config("region-trusted-thread-w2", _region, dict(TRAIN, **THREAD2), env=TRUSTED),
    Config("region-trusted-process-w0", _region, dict(TRAIN, num_workers=0), env=TRUSTED),
    Config("lmdb-process-w2", _converted("lmdb", "LMDBDataset"), dict(TRAIN, **PROC2)),
    Config("lmdb-thread-w2", _converted("lmdb", "LMDBDataset"), dict(TRAIN, **THREAD2)),
    Config("tfrecord-indexed-thread-w2", _converted("tfrecord", "TFRecordDataset"), dict(TRAIN, **THREAD2)),
    Config("tfrecord-indexed-process-w2", _converted("tfrecord", "TFRecordDataset"), dict(TRAIN, **PROC2)),
    Config("tfrecord-stream-process-w2", _streams("tfrecord"), dict(PROC2)),
    Config("tfrecord-stream-process-w0", _streams("tfrecord"), dict(num_workers=0)),
    Config("tfrecord-stream-rank1of2", _streams("tfrecord"), dict(PROC2, rank=1, world_size=2)),
    Config("wds-process-w2-shuffle", _webdataset(), dict(TRAIN, **PROC2)),
    Config("wds-process-w0", _webdataset(_eval), dict(num_workers=0)),
    Config("wds-rank1of2-w2", _webdataset(), dict(TRAIN, **PROC2, rank=1, world_size=2)),
    Config("multiview-process-w2", _multiview, dict(TRAIN, **PROC2)),
    Config("multiview-thread-w2", _multiview, dict(TRAIN, **THREAD2)),
    Config("skip-damaged-process-w2", _image_folder(damaged=True), dict(TRAIN, **PROC2, on_error="skip")),
    Config("skip-damaged-thread-w2", _image_folder(damaged=True), dict(TRAIN, **THREAD2, on_error="skip")),
    Config("skip-damaged-process-w0", _image_folder(damaged=True), dict(TRAIN, num_workers=0, on_error="skip")),
    Config("subset-process-w2", _subset, dict(TRAIN, **PROC2)),
    Config("user-dataset-process-w2", _user, dict(TRAIN, **PROC2)),
    Config("user-dataset-thread-w2", _user, dict(TRAIN, **THREAD2)),
    Config("user-arrays-process-w0", lambda root: ArrayDataset(), dict(TRAIN, num_workers=0)),
    # Every row the GPU can take decoded by it (gpu_cpu_share="auto" would depend on timing).
    Config("gpu-decode-on-cpu-w2", _gpu_ready, dict(TRAIN, **PROC2, decode="gpu", gpu_cpu_share=0)),
    Config("gpu-decode-on-cpu-w0", _gpu_ready, dict(TRAIN, num_workers=0, decode="gpu", gpu_cpu_share=0)),
    Config("resume-folder-process-to-thread", _image_folder(), dict(TRAIN, **PROC2), "resume", dict(THREAD2)),
    Config(
        "resume-folder-two-ranks-to-one",
        _image_folder(),
        dict(TRAIN, **PROC2, rank=0, world_size=2),
        "resume",
        dict(rank=0, world_size=1, num_workers=0),
    ),
    Config("resume-wds-w2-to-w3", _webdataset(), dict(TRAIN, **PROC2), "resume", dict(num_workers=3)),
    Config("resume-tfrecord-stream", _streams("tfrecord"), dict(PROC2), "resume"),
]
BY_NAME = {c.name: c for c in CONFIGS}


# ---- running and recording --------------------------------------------------------------------


def record(out: tuple, epoch: int) -> dict:
    """One batch as the reference keeps it: enough to tell batches apart and to show how they differ."""
    images, targets, indices = out[0], out[1], out[2]
    views = images if isinstance(images, (list, tuple)) else [images]
    digest = hashlib.sha256()
    means, shapes = [], []
    for v in views:
        hwc = v.permute(0, 2, 3, 1).contiguous()  # NCHW channels_last on the way out: one layout to hash
        digest.update(str(hwc.dtype).encode() + str(tuple(hwc.shape)).encode())
        digest.update(hwc.numpy().tobytes())
        means.append(round(float(hwc.double().mean()), 4))
        shapes.append(list(hwc.shape))
    t = targets.numpy()
    return {
        "epoch": epoch,
        "indices": indices.tolist(),
        "targets": t.round(4).tolist() if t.dtype.kind == "f" else t.tolist(),
        "shapes": shapes,
        "means": means,
        "pixels": digest.hexdigest()[:20],
    }


def _pass(loader: Any, epoch: int, stop: int | None = None) -> list[dict]:
    loader.set_epoch(epoch)
    out = []
    for k, batch in enumerate(loader):
        if stop is not None and k == stop:
            break
        out.append(record(batch, epoch))
    return out


def _skips(loader: Any) -> list[list[int]]:
    return sorted([s.epoch, s.index] for s in loader.skipped)


SHARD_KEYS = ("rank", "world_size", "drop_uneven")


def spelled(options: dict) -> dict:
    """``options`` in the Loader's spelling: ``shard=fl.Shard(rank=, world_size=, drop_uneven=)``
    where fastload has it (the suite makes the old keywords' DeprecationWarning an error); the
    old keywords on the main the reference was recorded on, which knew no other."""
    import fastload as fl

    if not hasattr(fl, "Shard") or not any(k in options for k in SHARD_KEYS):
        return options
    rest = {k: v for k, v in options.items() if k not in SHARD_KEYS}
    return {**rest, "shard": fl.Shard(**{k: options[k] for k in SHARD_KEYS if k in options})}


def collect(config: Config, root: str) -> dict:
    """What ``config`` yields, as the reference records it."""
    import fastload as fl

    dataset = config.make(root)
    options = {**BASE, **config.options}
    result: dict[str, Any] = {"input": digest_tree(root)}
    if config.run == "epochs":
        with fl.Loader(dataset, **spelled(options)) as loader:
            result["batches"] = _pass(loader, 0) + _pass(loader, 1)
            result["skipped"] = _skips(loader)
            result["len"] = len(loader)
        return result
    # Every rank of the saved run stops after its own number of batches (2, 1, ...).
    first, states = [], []
    for rank in range(options.get("world_size", 1)):
        ranked = {**options, "rank": rank} if "world_size" in options else options
        with fl.Loader(dataset, **spelled(ranked)) as loader:
            first += _pass(loader, 1, stop=max(1, 2 - rank))
            states.append(loader.state_dict())
    resumed = {**options, **config.resumed}
    with fl.Loader(dataset, **spelled(resumed)) as again:
        again.load_state_dict(states)
        rest = []
        for batch in again:
            rest.append(record(batch, 1))
        result["batches"] = first + rest + _pass(again, 2)
        result["skipped"] = _skips(again)
    return result


@contextlib.contextmanager
def environment(root: str) -> Iterator[None]:
    """The fixed environment of :data:`ENV`, with caches under ``root``; restored after."""
    saved = dict(os.environ)
    os.environ.update(ENV, XDG_CACHE_HOME=os.path.join(root, "cache"), FASTLOAD_CACHE_DIR=os.path.join(root, "cache"))
    for name in UNSET:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(name: str, root: str) -> dict:
    os.makedirs(root, exist_ok=True)
    config = BY_NAME[name]
    with environment(root):
        os.environ.update(config.env)
        return collect(config, os.path.join(root, "data"))


def dumps(reference: dict) -> str:
    """The reference as JSON, a batch per line (diffs of the file then show batches)."""
    lines = ["{"]
    for k, (name, got) in enumerate(reference.items()):
        lines.append(f"{json.dumps(name)}: {{")
        fields = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in got.items() if key != "batches"]
        batches = ",\n".join(f"    {json.dumps(b, sort_keys=True)}" for b in got["batches"])
        lines.append(",\n".join([*fields, f'  "batches": [\n{batches}\n  ]']))
        lines.append("}" + ("," if k < len(reference) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def load_reference() -> dict:
    with open(REFERENCE) as f:
        return json.load(f)


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write tests/golden_batches.json")
    parser.add_argument("--only", action="append", help="configuration name(s)")
    args = parser.parse_args()
    names = args.only or [c.name for c in CONFIGS]
    reference = load_reference() if os.path.exists(REFERENCE) else {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            got = run(name, tmp)
        print(f"{name}: {len(got['batches'])} batches, skipped {got['skipped']}", flush=True)
        reference[name] = got
    if args.write:
        ordered = {c.name: reference[c.name] for c in CONFIGS if c.name in reference}
        with open(REFERENCE, "w") as f:
            f.write(dumps(ordered))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    main()
