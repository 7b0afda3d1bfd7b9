"""decode="gpu": workers plan, the driver's GPU decode executor decodes, crops, resizes and flips,
the driver normalizes.

On this CPU machine the executor runs with nvImageCodec's CPU backend and torch on the CPU
(FASTLOAD_GPU_DECODE_ON_CPU=1); the tests marked cuda run it on a GPU.

Tolerances: on the CPU the executor resizes uint8 with the very kernel the CPU path uses
(``interpolate(antialias=True)`` is PyTorch's ``_upsample_bilinear2d_aa``) and
nvImageCodec's CPU backend decodes as libjpeg-turbo does, so with ``reduced_decode=False``
the pixels are equal. By default the CPU path may decode at a DCT scale or with fast
chroma upsampling, within the planner's tolerance of the full decode (measured on real
photos: mean error per image 0.7-1.2 levels of 255, worst 2.9; fastload.decode.plan);
the executor always decodes at full size, so the two differ by that much: at most 3 levels
per image, 1.5 over a batch. On a GPU, nvJPEG's IDCT and the float resize (rounded once)
may add about a level, within the same bounds.
"""

import io
import os

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, make_image, photo_jpegs, png_bytes
from PIL import Image

import fastload as fl
from fastload.decode import roi
from fastload.device.driver import DeviceDriver
from fastload.device.gpudecode import GpuDecode, GpuPipeline, nvdecode
from fastload.sources import InFlight
from fastload.sources.fetch import SampleLoader
from fastload.sources.packed import PackMaker
from fastload.sources.pools import PlainPool
from fastload.sources.request import BatchRequest
from fastload.sources.samples import Samples

pytestmark = pytest.mark.skipif(not roi.available(), reason="GPU decode needs nvImageCodec: fastload[roi]")

IMAGE_TOLERANCE = 3.0  # levels of 255, mean absolute difference of one image
BATCH_TOLERANCE = 1.5  # the same over a batch


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setenv("FASTLOAD_GPU_DECODE_ON_CPU", "1")


def _write(root, files):
    os.makedirs(os.path.join(root, "a"), exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(root, "a", name), "wb") as f:
            f.write(data)
    return str(root)


def _photos(n=10):
    return {f"{i:02d}.jpg": jpeg_bytes(make_image(i, 140 + 9 * i, 190 + 7 * i)) for i in range(n)}


def _odd_ones():
    """What the GPU decoder does not get: a PNG, a CMYK JPEG, a progressive JPEG (and a
    grey one, which it does)."""
    img = make_image(99, 150, 210)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90, progressive=True)
    return {"png.png": png_bytes(Image.fromarray(img)), "cmyk.jpg": jpeg_bytes(img, mode="CMYK"),
            "progressive.jpg": buf.getvalue(), "grey.jpg": jpeg_bytes(img, mode="L")}


def _batches(ds, decode, epochs=(0,), **kw):
    opts = dict(batch_size=8, num_workers=0, device="cpu", normalize=False, shuffle=True, return_index=True, seed=0)
    opts.update(kw)
    out = []
    with fl.Loader(ds, decode=decode, **opts) as loader:
        for epoch in epochs:
            loader.set_epoch(epoch)
            out += [tuple(t.clone() for t in b) for b in loader]
        stats = loader.stats()
    return out, stats


def _assert_same(a, b, exact=True):
    for (xa, ya, ia), (xb, yb, ib) in zip(a, b, strict=True):
        assert torch.equal(ya, yb) and torch.equal(ia, ib)
        if exact:
            assert torch.equal(xa, xb)
        else:
            diff = (xa.float() - xb.float()).abs().mean(dim=(1, 2, 3))
            assert diff.max() <= IMAGE_TOLERANCE and diff.mean() <= BATCH_TOLERANCE, diff


@pytest.mark.parametrize("preset", ["train", "eval"])
def test_gpu_decode_on_cpu_equals_the_cpu_path_without_reduced_decode(tmp_path, on_cpu, preset):
    root = _write(tmp_path, {**_photos(), **_odd_ones()})
    tf = getattr(fl.transforms, preset)(64, reduced_decode=False)
    ds = fl.ImageFolder(root, tf)
    gpu, stats = _batches(ds, "gpu", epochs=(0, 1))
    cpu, _ = _batches(ds, "cpu", epochs=(0, 1))
    _assert_same(gpu, cpu)
    assert stats["cpu_fallback_rows"] == 0 and stats["batches"] == len(gpu)


def test_encoded_batches_cross_from_worker_processes(tmp_path, on_cpu):
    ds = fl.ImageFolder(_write(tmp_path, {**_photos(6), **_odd_ones()}), fl.transforms.train(48, reduced_decode=False))
    gpu, _ = _batches(ds, "gpu", num_workers=1, batch_size=5)
    cpu, _ = _batches(ds, "cpu", batch_size=5)
    _assert_same(gpu, cpu)


def test_gpu_decode_on_cpu_is_within_tolerance_of_the_default_cpu_path(tmp_path, on_cpu):
    photos = {f"{i:02d}.jpg": data for i, data in enumerate(photo_jpegs((300, 420), 1, seed=5))}
    ds = fl.ImageFolder(_write(tmp_path, photos), fl.transforms.train(112))
    gpu, _ = _batches(ds, "gpu", normalize=True)
    cpu, _ = _batches(ds, "cpu", normalize=True)
    assert all(x.is_contiguous(memory_format=torch.channels_last) and x.dtype == torch.float32 for x, _, _ in gpu)
    std = torch.tensor(fl.Normalize().std).view(1, 3, 1, 1)
    _assert_same([(x * std * 255, y, i) for x, y, i in gpu], [(x * std * 255, y, i) for x, y, i in cpu], exact=False)


def _packed(ds, inflight):
    """(the row loader, the EncodedBatch of every sample): as the workers make it."""
    maker = PackMaker(SampleLoader(Samples(ds), "raise", inflight), GpuPipeline.of(ds))
    return maker.loader, maker.make(BatchRequest(0, np.arange(len(ds))), 0, PlainPool(pin=False))


def test_workers_send_bytes_for_the_gpu_and_pixels_for_what_it_cannot_take(tmp_path):
    files = {**_photos(4), **_odd_ones()}
    ds = fl.ImageFolder(_write(tmp_path, files), fl.transforms.train(64))
    batch = _packed(ds, InFlight(1))[1]
    names = [os.path.basename(ds.describe(i)) for i in range(len(ds))]
    on_cpu = sorted(names[j] for j in batch.decoded_rows)
    assert on_cpu == ["cmyk.jpg", "png.png", "progressive.jpg"]
    assert len(batch.rows) == len(ds) - 3 and batch.decoded.shape == (3, 64, 64, 3)
    for r, j in enumerate(batch.rows):
        assert batch.encoded(r).tobytes() == files[names[j]]


@pytest.mark.parametrize("resize", ["float", pytest.param("triton", marks=pytest.mark.triton)])
def test_the_float_resize_cuda_runs_is_the_uint8_one_to_a_level(tmp_path, resize):
    """On CUDA the executor resizes in float32 (the Triton kernel; a loop of F.interpolate
    without Triton) and rounds once. Run here on the CPU (the kernel in Triton's
    interpreter), that stays within one level of the uint8 kernel the CPU path runs."""
    ds = fl.ImageFolder(_write(tmp_path, {**_photos(3), **_odd_ones()}), fl.transforms.train(64))
    fetcher, batch = _packed(ds, InFlight(2))
    out = {}
    for method in ("uint8", resize):
        driver = DeviceDriver(GpuDecode(fetcher, resize=method), "cpu", 1, fl.Normalizer(normalize=False))
        (out[method], _), = list(driver.run([batch]))
    diff = (out["uint8"].int() - out[resize].int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.2  # the uint8 kernel rounds its weights too
    assert batch.flips.any() and not batch.flips.all()
    sent = torch.from_numpy(batch.decoded_rows)  # the rows the workers decoded, as they sent them
    for x in out.values():
        assert torch.equal(x[sent].permute(0, 2, 3, 1), batch.decoded)


def test_the_executor_refuses_an_unknown_resize():
    with pytest.raises(ValueError, match="resize must be one of"):
        GpuDecode(None, resize="bicubic")


def test_rows_the_decoder_refuses_are_decoded_by_the_cpu_path(tmp_path, on_cpu, refuse):
    ds = fl.ImageFolder(_write(tmp_path, _photos(8)), fl.transforms.train(64, reduced_decode=False))
    refuse.update({1, 6})
    gpu, stats = _batches(ds, "gpu", gpu_cpu_share=0)  # every row to the decoder
    cpu, _ = _batches(ds, "cpu")
    _assert_same(gpu, cpu)
    assert stats["cpu_fallback_rows"] == 2


class _RegionRefusing:
    """nvJPEG before 13.2 as nvImageCodec runs it by default with fancy upsampling: every
    region request comes back None (the tests here tell a region by its shape); whole images
    decode. ``calls`` gets (streams, of which regions) per call."""

    def __init__(self, real, calls):
        self.real, self.calls = real, calls

    def decode(self, streams, **kw):
        images = self.real.decode(streams, **kw)
        regions = [(img.shape[0], img.shape[1]) != (s.height, s.width) for img, s in zip(images, streams)]
        self.calls.append((len(streams), sum(regions)))
        return [None if region else img for img, region in zip(images, regions)]


@pytest.mark.parametrize("regions", ["plain", "padded"])
def test_regions_the_backend_refuses_are_decoded_whole_and_asked_for_again(tmp_path, on_cpu, monkeypatch, regions):
    """A backend that refuses regions (nvJPEG < 13.2 under nvImageCodec's default, the first
    GPU runs: 153 rows loaded again on the CPU, then regions switched off for good): those
    images are decoded whole by the same decoder and cut, counted, and every later batch
    still asks for its regions (a refusal never switches regions off)."""
    ds = fl.ImageFolder(_write(tmp_path, _photos(16)), fl.transforms.train(64, reduced_decode=False))
    calls: list[tuple[int, int]] = []
    decoders = []
    init = nvdecode.BatchDecoder.__init__

    def refusing_regions(self, *a, **kw):
        init(self, *a, **{**kw, "regions": regions})
        self._decoder = _RegionRefusing(self._decoder, calls)
        decoders.append(self)

    monkeypatch.setattr(nvdecode.BatchDecoder, "__init__", refusing_regions)
    gpu, stats = _batches(ds, "gpu", epochs=(0, 1), gpu_cpu_share=0)
    cpu, _ = _batches(ds, "cpu", epochs=(0, 1))
    _assert_same(gpu, cpu)
    assert stats["cpu_fallback_rows"] == 0
    asked = [n for _, n in calls[::2]]  # each batch: its call, then the refused regions whole
    assert len(calls) == 2 * len(gpu) and all(n > 0 for n in asked), calls
    assert [total for total, _ in calls[1::2]] == asked, calls  # whole: exactly the refused rows
    (decoder,) = decoders
    assert decoder.regions == regions and decoder.regions_refused == sum(asked)


def _corrupt(data: bytes) -> bytes:
    """Zeros over part of the scan: libjpeg warns (corrupt data), nvImageCodec decodes on."""
    mid = len(data) // 2
    return data[:mid] + bytes(400) + data[mid + 400 :]


@pytest.mark.parametrize("preset", ["train", "eval"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_decode_gpu_is_not_strict_and_its_docs_say_so(tmp_path, on_cpu, preset, device):
    """Corrupt scan data: decode="cpu" refuses the file, decode="gpu" decodes it into the batch
    with no error and nothing skipped (nvImageCodec's CPU backend here; nvJPEG under -m cuda).
    The Loader's and LoaderConfig.decode's docstrings and the GPU guide say so, and what to
    do; should GPU decode turn strict, say that instead."""
    files = _photos(2)
    files["01.jpg"] = _corrupt(files["01.jpg"])
    ds = fl.ImageFolder(_write(tmp_path, files), getattr(fl.transforms, preset)(64))
    with pytest.raises(fl.DecodeError, match="01.jpg"):
        _batches(ds, "cpu", batch_size=2, device=device)
    # Every row to the GPU decoder (rows the workers decode for gpu_cpu_share are strict).
    gpu, stats = _batches(ds, "gpu", batch_size=2, device=device, gpu_cpu_share=0)
    assert [len(x) for x, _, _ in gpu] == [2] and stats["cpu_fallback_rows"] == 0
    guide = open(os.path.join(os.path.dirname(__file__), "..", "docs", "guides", "gpu.md")).read()
    for doc in (fl.Loader.__doc__, fl.LoaderConfig.__doc__, guide):
        said = " ".join(doc.replace("`", "").split())
        assert "is not strict" in said and "whatever FASTLOAD_ROI says" in said, said
        assert "--verify" in said and 'keep decode="cpu"' in said, said


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("where", ["worker", "driver"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_failures_name_their_file_under_on_error(tmp_path, on_cpu, refuse, on_error, where, device):
    files = _photos(8)
    bad = "05.jpg"
    # Cut short: the worker finds it (no end-of-image marker). Corrupt inside, refused by
    # the decoder: the CPU fall-back in this process finds it.
    files[bad] = files[bad][: len(files[bad]) // 2] if where == "worker" else _corrupt(files[bad])
    ds = fl.ImageFolder(_write(tmp_path, files), fl.transforms.train(64))
    with pytest.raises(fl.DecodeError):
        ds.load(5)
    refuse.update(range(8))  # every row: whichever row sample 5 lands in
    loader = fl.Loader(ds, batch_size=8, num_workers=0, device=device, decode="gpu", on_error=on_error,
                       return_index=True, gpu_cpu_share=0)
    if on_error == "raise":
        with pytest.raises(fl.DecodeError, match=os.path.join("a", bad)):
            list(loader)
    else:
        with pytest.warns(RuntimeWarning, match="skipped 1 bad sample"):
            (x, y, idx), = list(loader)
        assert 5 not in idx.tolist()
        assert [s.index for s in loader.skipped] == [5] and loader.skipped[0].where.endswith(bad)
    loader.close()


def test_decode_gpu_needs_cuda_or_the_test_switch(tmp_path, monkeypatch):
    monkeypatch.delenv("FASTLOAD_GPU_DECODE_ON_CPU", raising=False)
    ds = fl.ImageFolder(_write(tmp_path, _photos(2)), fl.transforms.train(32))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="decode='gpu' decodes on a CUDA device.*use decode='cpu'"):
            fl.Loader(ds, device="cpu", decode="gpu", num_workers=0)
    with pytest.raises(ValueError, match="decode must be one of"):
        fl.LoaderConfig(decode="nvjpeg")


@pytest.mark.parametrize("transform, message", [
    (lambda: [fl.transforms.RandomResizedCrop(32), fl.transforms.CenterCrop(16)], "at most a RandomHorizontalFlip"),
    (lambda: [fl.transforms.Resize(40)], "RandomResizedCrop, or Resize\\(int\\) \\+ CenterCrop"),
    (lambda: fl.transforms.train(32, antialias=False), "antialiasing only"),
    (lambda: [fl.transforms.RandomResizedCrop(32), lambda img: img], "at most a RandomHorizontalFlip"),
])
def test_transforms_gpu_decode_cannot_run_are_a_clear_error(tmp_path, on_cpu, transform, message):
    ds = fl.ImageFolder(_write(tmp_path, _photos(2)), transform())
    with pytest.raises(ValueError, match=message + ".*decode='cpu'"):
        fl.Loader(ds, device="cpu", decode="gpu", num_workers=0)


def test_gpu_decode_runs_on_the_thread_backend_as_on_processes(tmp_path, on_cpu):
    # The same maker on every backend: the thread backend packs the rows it plans on its threads.
    ds = fl.ImageFolder(_write(tmp_path, {**_photos(6), **_odd_ones()}), fl.transforms.train(48, reduced_decode=False))
    threads, stats = _batches(ds, "gpu", epochs=(0, 1), backend="thread", num_workers=2, batch_size=5)
    processes, _ = _batches(ds, "gpu", epochs=(0, 1), batch_size=5)
    cpu, _ = _batches(ds, "cpu", epochs=(0, 1), batch_size=5)
    _assert_same(threads, processes)
    _assert_same(threads, cpu)
    assert stats["gpu_decoded_rows"] > 0 and stats["cpu_fallback_rows"] == 0


def test_datasets_gpu_decode_cannot_serve_are_a_clear_error(tmp_path, on_cpu):
    with pytest.raises(TypeError, match="decode='gpu' needs a fastload dataset.*WrappedDataset|got list"):
        fl.Loader([(np.zeros((8, 8, 3), np.uint8), 0)], device="cpu", decode="gpu", num_workers=0)


# --- on a GPU ------------------------------------------------------------------------------


def _cuda_batches(ds, decode, epochs=(0,), **kw):
    opts = dict(batch_size=16, num_workers=2, device="cuda", normalize=False, shuffle=True, return_index=True, seed=0)
    opts.update(kw)
    with fl.Loader(ds, decode=decode, **opts) as loader:
        out = []
        for epoch in epochs:
            loader.set_epoch(epoch)
            out += [tuple(t.clone() for t in b) for b in loader]
        torch.cuda.synchronize()
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("preset", ["train", "eval"])
def test_cuda_gpu_decode_is_within_tolerance_of_the_cpu_path(tmp_path, preset):
    root = _write(tmp_path, {**_photos(24), **_odd_ones()})
    ds = fl.ImageFolder(root, getattr(fl.transforms, preset)(64, reduced_decode=False))
    gpu, cpu = _cuda_batches(ds, "gpu"), _cuda_batches(ds, "cpu")
    _assert_same([tuple(t.cpu() for t in b) for b in gpu], [tuple(t.cpu() for t in b) for b in cpu], exact=False)
    names = [os.path.basename(ds.describe(i)) for i in range(len(ds))]
    for (xg, _, idx), (xc, _, _) in zip(gpu, cpu):
        for j, i in enumerate(idx.tolist()):  # rows decoded on the CPU are the CPU path's, exactly
            if names[i] in ("png.png", "cmyk.jpg", "progressive.jpg"):
                assert torch.equal(xg[j], xc[j])


@pytest.mark.cuda
def test_cuda_batches_survive_a_slow_consumer_without_host_syncs(tmp_path):
    """The consumer's step is long and queued after each hand-over: a batch whose memory
    were reused early, or read before its decode finished, would change its sums. The
    reference synchronizes after every batch; the loop under test never does."""
    ds = fl.ImageFolder(_write(tmp_path, _photos(64)), fl.transforms.train(64, reduced_decode=False))
    # A fixed share: both passes decode the same rows on the CPU ("auto" may move between them).
    opts = dict(decode="gpu", batch_size=16, num_workers=2, device="cuda", normalize=False, shuffle=True, prefetch_factor=3,
                gpu_cpu_share=0.5)
    with fl.Loader(ds, **opts) as loader:
        reference = []
        for x, _ in loader:
            torch.cuda.synchronize()
            reference.append(x.double().sum(dim=(1, 2, 3)).cpu())
        loader.set_epoch(0)
        sums = []
        for x, _ in loader:
            torch.cuda._sleep(50_000_000)  # a long step on the consumer stream, before reading the batch
            sums.append(x.double().sum(dim=(1, 2, 3)))
        torch.cuda.synchronize()
    for got, want in zip(sums, reference, strict=True):
        assert torch.equal(got.cpu(), want)


@pytest.mark.cuda
def test_cuda_refused_rows_and_memory_stay_flat(tmp_path, refuse):
    """Memory as the driver counts it (mem_get_info), so nvImageCodec's own buffers count:
    memory_reserved() alone sees only torch's allocator (issue 26, item 8)."""
    from conftest import device_memory_per_epoch

    ds = fl.ImageFolder(_write(tmp_path, _photos(32)), fl.transforms.train(64, reduced_decode=False))
    refuse.update({0, 5})
    with fl.Loader(ds, decode="gpu", batch_size=16, num_workers=2, device="cuda", shuffle=True, gpu_cpu_share=0) as loader:
        memory = device_memory_per_epoch(loader, 8)
        assert loader.stats()["cpu_fallback_rows"] == 2 * 2 * 8
    used, reserved = zip(*memory)
    assert reserved[-1] == reserved[2], reserved
    # The driver maps in 2 MiB pages: a leak of decoded images (about 1 MiB a batch here)
    # grows by more over 5 epochs.
    assert used[-1] - used[2] <= 2 * 2**20, used


# --- the decoder as built for the hardware (nvdecode.BatchDecoder), without a GPU -----------


def _fake_nv(made):
    """nvImageCodec's Python API as BatchDecoder uses it on CUDA, recording each Decoder."""
    from types import SimpleNamespace

    kinds = SimpleNamespace(HW_GPU_ONLY="HW", GPU_ONLY="GPU", HYBRID_CPU_GPU="HYBRID", CPU_ONLY="CPU")
    policies = SimpleNamespace(FIXED="fixed", ADAPTIVE_MINIMIZE_IDLE_TIME="adaptive")
    return SimpleNamespace(
        BackendKind=kinds, LoadHintPolicy=policies, NVIMGCODEC_DEVICE_CPU_ONLY=-1,
        Backend=lambda kind, load_hint=1.0, load_hint_policy="fixed": (kind, load_hint, load_hint_policy),
        DecodeParams=lambda **kw: kw,
        Decoder=lambda **kw: made.append(kw) or object(),
    )


@pytest.fixture
def built_on_cuda(monkeypatch):
    """BatchDecoder on cuda:0 with a recording stand-in for nvImageCodec: what it asks for."""
    made: list[dict] = []
    monkeypatch.setattr(nvdecode.roi, "module", lambda: _fake_nv(made))
    return made


@pytest.mark.parametrize("version, mode", [
    ((13, 0, 4), "padded"), ((13, 1, 9), "padded"), ((12, 9, 0), "padded"), (None, "padded"),
    ((13, 2, 0), "plain"), ((13, 3, 2), "plain"), ((14, 0, 0), "plain"),
])
def test_regions_are_decided_by_the_nvjpeg_version_when_the_decoder_is_built(built_on_cuda, monkeypatch, version,
                                                                            mode):
    """nvJPEG >= 13.2 decodes regions with fancy upsampling exactly: plain regions; older (or
    unknown) nvJPEG gets a region's edge pixel wrong: regions padded by one MCU. Either way
    nvImageCodec is told to take regions with fancy upsampling (else it refuses them on old
    nvJPEG, a warning per image), the backends come hardware first, and the hardware
    decoder preallocates for the batch."""
    monkeypatch.setattr(nvdecode, "nvjpeg_version", lambda: version)
    decoder = nvdecode.BatchDecoder(torch.device("cuda", 0), batch_size=128, image_size=(375, 500))
    assert decoder.regions == mode and decoder.nvjpeg == version
    (made,) = built_on_cuda
    options = made["options"].split()
    assert ":fancy_upsampling=1" in options
    assert {"nvjpeg_cuda_decoder:enable_roi_fancy_upsampling=1", "nvjpeg_hw_decoder:enable_roi_fancy_upsampling=1",
            "nvjpeg_hw_decoder:preallocate_batch_size=128", "nvjpeg_hw_decoder:preallocate_width_hint=500",
            "nvjpeg_hw_decoder:preallocate_height_hint=375"} <= set(options), options
    assert made["backends"] == [("HW", nvdecode.HW_LOAD, "adaptive"), ("GPU", 1.0, "fixed"), ("HYBRID", 1.0, "fixed")]
    assert made["device_id"] == 0
    # Told explicitly, the version does not matter.
    assert nvdecode.BatchDecoder(torch.device("cuda", 0), regions="whole").regions == "whole"


def test_the_nvjpeg_version_is_read_from_the_loaded_library_else_its_wheel(monkeypatch):
    monkeypatch.setattr(nvdecode, "loaded_nvjpeg", lambda: None)
    versions = {"nvidia-nvjpeg": "13.3.2.43"}

    def version(dist):
        if dist not in versions:
            raise nvdecode.importlib.metadata.PackageNotFoundError(dist)
        return versions[dist]

    monkeypatch.setattr(nvdecode.importlib.metadata, "version", version)
    assert nvdecode.nvjpeg_version() == (13, 3, 2)
    versions.clear()
    assert nvdecode.nvjpeg_version() is None
    monkeypatch.setattr(nvdecode, "loaded_nvjpeg", lambda: "/x/libnvjpeg.so.13")
    monkeypatch.setattr(nvdecode, "_library_version", lambda path: (13, 0, 4) if path == "/x/libnvjpeg.so.13" else None)
    versions["nvidia-nvjpeg"] = "13.3.2.43"  # installed, but not the one loaded
    assert nvdecode.nvjpeg_version() == (13, 0, 4)


@pytest.mark.parametrize("cores, threads", [(64, 4), (16, 4), (2, 2), (1, 1)])
def test_nvimgcodec_threads_are_bounded_not_one_per_core(built_on_cuda, monkeypatch, cores, threads):
    """nvImageCodec's 0 means a thread per core, beside 14 loader workers on 16 cores: the
    decoder asks for at most 4, and a negative count is an error naming it."""
    monkeypatch.setattr(nvdecode.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(nvdecode, "nvjpeg_version", lambda: (13, 3, 2))
    assert nvdecode.default_threads() == threads
    assert nvdecode.BatchDecoder(torch.device("cuda", 0)).threads == threads
    assert nvdecode.BatchDecoder(torch.device("cuda", 0), threads=0).threads == 0  # asked for: kept
    assert [m["max_num_cpu_threads"] for m in built_on_cuda] == [threads, 0]
    with pytest.raises(ValueError, match="threads must be >= 0.*got -1"):
        nvdecode.BatchDecoder(torch.device("cuda", 0), threads=-1)
    with pytest.raises(ValueError, match="regions must be one of.*got 'roi'"):
        nvdecode.BatchDecoder(torch.device("cpu"), regions="roi")


def test_the_executor_preallocates_for_its_first_batch(tmp_path, on_cpu, monkeypatch):
    ds = fl.ImageFolder(_write(tmp_path, _photos(6)), fl.transforms.train(48, reduced_decode=False))
    fetcher, batch = _packed(ds, InFlight(2))
    made = []
    init = nvdecode.BatchDecoder.__init__

    def recording(self, *a, **kw):
        made.append(kw)
        init(self, *a, **kw)

    monkeypatch.setattr(nvdecode.BatchDecoder, "__init__", recording)
    driver = DeviceDriver(GpuDecode(fetcher, decoder_threads=2), "cpu", 1, fl.Normalizer(normalize=False))
    list(driver.run([batch]))
    sizes = np.array([[140 + 9 * i, 190 + 7 * i] for i in range(6)])
    assert made == [{"threads": 2, "batch_size": 6, "image_size": tuple(int(v) for v in np.median(sizes, axis=0))}]


def test_padded_regions_cut_exactly_the_whole_decodes_pixels(tmp_path):
    """Real photos, RandomResizedCrop regions: the region cut from a region padded by one MCU
    (clamped to the image) is the whole decode's cut, pixel for pixel, as is a plain region's
    (libjpeg-turbo here; on a GPU the probe measures nvJPEG's: benchmarks/gpu_decode_probe.py)."""
    photos = {f"{i:02d}.jpg": data for i, data in enumerate(photo_jpegs((200, 420), 2, seed=3))}
    ds = fl.ImageFolder(_write(tmp_path, photos), fl.transforms.train(64, scale=(0.05, 0.3)))
    batch = _packed(ds, InFlight(1))[1]
    rows = [r for r in range(len(batch.rows)) if batch.region(r) is not None]
    assert len(rows) >= 8
    decoders = {m: nvdecode.BatchDecoder(torch.device("cpu"), regions=m) for m in nvdecode.REGION_MODES}
    out = {m: d.decode(batch)[0] for m, d in decoders.items()}
    edges = 0
    for r in rows:
        region, asked = batch.region(r), decoders["padded"].asked(batch, r)
        h, w = (int(v) for v in batch.sizes[r])
        assert asked == nvdecode.padded(region, h, w) != region
        assert asked[0] == max(0, region[0] - 16) and asked[3] == min(w, region[3] + 16)
        edges += asked[0] == 0 or asked[1] == 0 or asked[2] == h or asked[3] == w
        assert decoders["whole"].asked(batch, r) is None and decoders["plain"].asked(batch, r) == region
        want = out["whole"][r]
        assert want.shape == (region[2] - region[0], region[3] - region[1], 3)
        assert torch.equal(out["padded"][r], want) and torch.equal(out["plain"][r], want), r
    assert edges, "some padded regions clamped to the image"
    assert nvdecode.padded((3, 5, 40, 60), 50, 70) == (0, 0, 50, 70)


def test_nvimgcodec_logs_errors_only(monkeypatch):
    """A refused row is a warning line per image from nvImageCodec: fastload counts those
    (BatchDecoder.regions_refused, the CPU fall-back rows) and asks for errors only, unless
    the user set PYNVIMGCODEC_VERBOSITY."""
    roi.module()
    assert os.environ.get("PYNVIMGCODEC_VERBOSITY") == "1"
