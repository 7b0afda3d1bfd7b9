import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.sample import photo_like

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(cuda)


def jpeg_bytes(img: np.ndarray, quality: int = 92, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    pil = Image.fromarray(img)
    if mode:
        pil = pil.convert(mode)
    pil.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def png_bytes(pil: Image.Image) -> bytes:
    buf = io.BytesIO()
    pil.save(buf, format="PNG")
    return buf.getvalue()


def make_image(seed: int, h: int = 120, w: int = 160) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return photo_like(rng, h, w, rng.uniform(-1, 1, 3))


def write_folder(root, num_classes: int = 3, per_class: int = 8, size=(96, 128), seed: int = 0) -> str:
    """root/<class>/<i>.jpg with varied sizes around ``size``; returns root."""
    root = str(root)
    for c in range(num_classes):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
        for i in range(per_class):
            k = seed * 10_000 + c * 1000 + i
            h = size[0] + (k * 7) % 40
            w = size[1] + (k * 13) % 50
            with open(os.path.join(root, f"c{c}", f"{i:03d}.jpg"), "wb") as f:
                f.write(jpeg_bytes(make_image(k, h, w)))
    return root


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> str:
    return write_folder(tmp_path_factory.mktemp("folder"))
