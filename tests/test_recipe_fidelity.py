"""The timm port's batch stage against timm's own pipeline (issue 32, item 18): the erased boxes
of ``examples/timm_train.py``'s batch transforms, run by the Loader's own mechanism
(``fl.augment.BatchTransforms``), appear in as many images, with the same strength and area, as
those of timm's loader: ``FastCollateMixup`` in the collate, then ``PrefetchLoader``'s
normalization and ``RandomErasing`` on the mixed batch (its default); with ``--no-prefetcher``,
per-image ``RandomErasing`` after ``Normalize``, then ``Mixup`` on the batch.

Images are flat colours, so after mixing every clean pixel shares its colour with others (a
blend of two flat images is flat; CutMix gives two flat regions) and a pixel of a noise box
(``--remode pixel``: N(0, 1) per pixel and channel) has a colour of its own. Per image: erased
(any such pixel), the area (their share) and the strength (their standard deviation: 1 for
noise painted over the mixed image, less where the noise was mixed with the partner); compared
batch by batch (a batch shares one Mixup/CutMix draw).
"""

import importlib.util
import os
import random

import numpy as np
import pytest
import torch

import fastload as fl

import refs

stats = pytest.importorskip("scipy.stats", reason="the statistical tests need scipy")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES, BATCH, BATCHES, SIZE = 10, 4, 320, 24  # 1,280 images; 320 batch-wide Mixup/CutMix draws (boxes of a batch share one)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RECIPE = ["data", "--reprob", "0.25", "--remode", "pixel", "--mixup", "0.8", "--cutmix", "1.0", "--smoothing", "0.1",
          "--num-classes", str(CLASSES)]


def _example():
    spec = importlib.util.spec_from_file_location("timm_train", os.path.join(ROOT, "examples", "timm_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _samples(b: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Batch ``b``: flat-colour uint8 C×H×W images and their labels (the same for both pipelines)."""
    rng = np.random.default_rng(1000 + b)
    colours = rng.integers(0, 256, (BATCH, 3), dtype=np.uint8)
    return [np.broadcast_to(c[:, None, None], (3, SIZE, SIZE)).copy() for c in colours], rng.integers(0, CLASSES, BATCH)


def _normalize(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor([255 * v for v in MEAN]).view(1, 3, 1, 1)
    std = torch.tensor([255 * v for v in STD]).view(1, 3, 1, 1)
    return (images.float() - mean) / std


def _timm(prefetcher: bool) -> list[torch.Tensor]:
    timm = refs.timm()
    from timm.data.loader import PrefetchLoader
    from timm.data.random_erasing import RandomErasing

    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=CLASSES)
    if prefetcher:  # create_loader(use_prefetcher=True): mixed in the collate, erased after normalizing
        collate = timm.data.FastCollateMixup(**mix)
        batches = [collate(list(zip(*_samples(b)))) for b in range(BATCHES)]
        loader = PrefetchLoader(batches, MEAN, STD, device=torch.device("cpu"), re_prob=0.25, re_mode="pixel")
        return [images for images, _ in loader]
    erase, mixup, out = RandomErasing(0.25, mode="pixel", device="cpu"), timm.data.Mixup(**mix), []
    for b in range(BATCHES):  # erased per image in the dataset's transform, mixed in the training loop
        images, labels = _samples(b)
        batch = torch.stack([erase(_normalize(torch.from_numpy(i)[None])[0]) for i in images])
        out.append(mixup(batch, torch.from_numpy(labels))[0])
    return out


def _port(prefetcher: bool) -> list[torch.Tensor]:
    example = _example()
    args = example.parse_args(RECIPE + ([] if prefetcher else ["--no-prefetcher"]))
    steps, mixup_fn = example.build_batch_transforms(args, torch.device("cpu"))
    assert mixup_fn is not None and len(steps) == 2
    transforms, out = fl.augment.BatchTransforms(steps), []
    for b in range(BATCHES):
        images, labels = _samples(b)
        batch = _normalize(torch.from_numpy(np.stack(images))).contiguous(memory_format=torch.channels_last)
        out.append(transforms.apply((batch, torch.from_numpy(labels)), seed=0, epoch=0, batch=b)[0])
    return out


def _boxes(batches: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per batch: the share of its images erased, and the mean area and strength of their noise.

    The batch is the unit: its images share one Mixup/CutMix draw, on which how much of a box
    shows and how strong its noise is depend, so images of a batch are not independent samples.
    """
    rate, area, strength = [], [], []
    for batch in batches:
        erased, areas, strengths = 0, [], []
        for image in batch.permute(0, 2, 3, 1).reshape(len(batch), -1, 3).numpy():
            _, where, count = np.unique(image, axis=0, return_inverse=True, return_counts=True)
            noise = count[where.ravel()] == 1
            if noise.any():
                erased += 1
                areas.append(noise.mean())
                strengths.append(image[noise].std())
        rate.append(erased / len(batch))
        if erased:
            area.append(np.mean(areas))
            strength.append(np.mean(strengths))
    return np.array(rate), np.array(area), np.array(strength)


def _p_values(a, b) -> dict:
    """Rate: Welch's t-test on the batches' erased shares; area and strength: two-sample
    Kolmogorov-Smirnov on the batches' means."""
    return {
        "rate": stats.ttest_ind(a[0], b[0], equal_var=False).pvalue,
        "area": stats.ks_2samp(a[1], b[1]).pvalue,
        "strength": stats.ks_2samp(a[2], b[2]).pvalue,
    }


def _summary(name, boxes) -> str:
    rate, area, strength = boxes
    return f"{name}: {rate.mean():.0%} erased, area {np.median(area):.1%}, strength {np.median(strength):.2f} (batch medians)"


@pytest.fixture(scope="module")
def measured():
    return {(who, prefetcher): _boxes((_timm if who == "timm" else _port)(prefetcher))
            for who in ("timm", "port") for prefetcher in (True, False)}


@pytest.mark.parametrize("prefetcher", [True, False], ids=["prefetcher", "no-prefetcher"])
def test_the_ports_erased_boxes_match_timms_pipeline(measured, prefetcher):
    port, timm = measured["port", prefetcher], measured["timm", prefetcher]
    shown = f"{_summary('port', port)}; {_summary('timm', timm)}"
    # Deterministic draws: these are fixed numbers, not a flaky test.
    p = _p_values(port, timm)
    assert min(p.values()) > 1e-3, f"the port's boxes differ from timm's ({p}): {shown}"
    # The probe sees the difference the order makes: the other timm mode is told apart.
    other = _p_values(port, measured["timm", not prefetcher])
    assert other["rate"] < 1e-4 and other["strength"] < 1e-8, f"{other}: {shown}"
    if prefetcher:  # noise painted over the mixed image: N(0, 1) in a quarter of the images
        assert abs(port[0].mean() - 0.25) < 0.04 and abs(np.median(port[2]) - 1) < 0.03, shown
