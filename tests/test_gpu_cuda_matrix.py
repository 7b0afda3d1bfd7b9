"""decode="gpu" on a real GPU in every cell the CPU machine runs only on nvImageCodec's CPU
backend (tests/test_gpu_streams.py, tests/test_gpu_views.py): sources {folder, TFRecord
stream, WebDataset} x runners {in-process, threads, processes} x {one view, a MultiView},
each batch within the GPU tolerance of the CPU path's on the same device (nvJPEG's IDCT and
chroma upsampling differ from libjpeg-turbo's by a level or so), indices and targets equal.

The multi-view cells decode each image once as the region of its views' union box, which is
nvJPEG's region path (plain on nvJPEG >= 13.2, padded by one MCU on older ones).
"""

import pytest
import torch
from test_gpu_decode import BATCH_TOLERANCE, IMAGE_TOLERANCE, _odd_ones, _photos, _write
from test_gpu_streams import RUNNERS, _stream
from test_gpu_views import _views

import fastload as fl
from fastload.views import map_images

pytestmark = pytest.mark.cuda

SOURCES = ["folder", "tfrecord", "wds"]


def _source(kind, root, multi):
    tf = _views() if multi else fl.transforms.train(48, reduced_decode=False)
    images = {**_photos(14), **_odd_ones()}
    if kind == "folder":
        return fl.ImageFolder(_write(root, images), tf)
    return _stream(kind, root / kind, list(images.values()), tf)


def _batches(ds, decode, runner):
    opts = dict(batch_size=4, device="cuda", normalize=False, return_index=True, seed=3, **RUNNERS[runner])
    out = []
    with fl.Loader(ds, decode=decode, **opts) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            out += [tuple(map_images(lambda t: t.cpu(), t) for t in b) for b in loader]
        torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("multi", [False, True], ids=["one-view", "multi-view"])
@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("kind", SOURCES)
def test_cuda_gpu_decode_in_every_cell_is_within_tolerance_of_the_cpu_path(tmp_path, kind, runner, multi):
    ds = _source(kind, tmp_path, multi)
    gpu, cpu = _batches(ds, "gpu", runner), _batches(ds, "cpu", runner)
    assert len(gpu) == len(cpu) > 0
    for (xg, yg, ig), (xc, yc, ic) in zip(gpu, cpu):
        assert torch.equal(ig, ic) and torch.equal(yg, yc), (ig, ic)
        views_g, views_c = (xg, xc) if multi else ((xg,), (xc,))
        assert len(views_g) == len(views_c) == (3 if multi else 1)
        for k, (vg, vc) in enumerate(zip(views_g, views_c)):
            assert vg.shape == vc.shape, (k, ig)
            diff = (vg.float() - vc.float()).abs().flatten(1).mean(1)
            assert diff.max() <= IMAGE_TOLERANCE and diff.mean() <= BATCH_TOLERANCE, (kind, runner, k, ig, diff)
