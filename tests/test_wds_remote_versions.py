"""Remote shards that change or crawl (issue 32 items 7 and 15): a shard replaced mid-download
(ETag v1 -> v2, same size) is downloaded again from its start, never spliced; a server that
sends half of what is left and then stalls is given up on after (retries + 1) stalls, each
one a warning naming the URL and byte; the indexing progress bar counts bytes."""

import io
import os
import tarfile
import time
import warnings

import numpy as np
import pytest

import fastload as fl

from wds_servers import http_server, write_shards

SAMPLES = 300


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _ppm(seed):
    """An 8x8 PPM image: its size does not depend on its pixels, so two versions are the same size."""
    return b"P6\n8 8\n255\n" + np.random.default_rng(seed).integers(0, 256, (8, 8, 3), np.uint8).tobytes()


def _shard(path, first_seed, order=1):
    """A shard of SAMPLES samples s00000 ...: image _ppm(first_seed + n), target n, in key order
    (``order=-1``: reversed, so another version of the same size has its members elsewhere);
    returns {key: image}."""
    images = {f"s{n:05d}": _ppm(first_seed + n) for n in range(SAMPLES)}
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, image in list(images.items())[::order]:
            n = int(key[1:])
            for ext, data in (("ppm", image), ("cls", str(n).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return images


@pytest.mark.parametrize("cache", [True, False])
def test_a_shard_replaced_mid_download_is_downloaded_again_never_spliced(tmp_path, cache):
    root = tmp_path / "srv"
    root.mkdir()
    _shard(root / "shard-000000.tar", 0)
    v2 = _shard(tmp_path / "v2.tar", 10_000, order=-1)
    assert os.path.getsize(root / "shard-000000.tar") == os.path.getsize(tmp_path / "v2.tar")
    faults = {"shard-000000.tar": ("swap", str(tmp_path / "v2.tar"))}
    with http_server(root, faults=faults) as (base, hits), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = fl.WebDataset(base + "/shard-000000.tar", cache_dir=str(tmp_path / "c"), cache=cache,
                           image_key="ppm", retries=2)
        assert len(ds) == SAMPLES  # 265 when the two versions were spliced
        ranges = list(hits.ranges["shard-000000.tar"])  # the downloads for indexing
        wrong = [i for i in range(SAMPLES) if ds.read(i) != (v2[ds.table.keys[i]], int(ds.table.keys[i][1:]))]
        assert not wrong, f"{len(wrong)} samples are not version 2's"
    # Resumed from the byte reached (If-Range: the server sends version 2 whole), then anew from byte 0.
    assert ranges == [None, ranges[1], None] and ranges[1].startswith("bytes="), ranges
    (warning,) = [str(w.message) for w in caught if "replaced" in str(w.message)]
    assert "shard-000000.tar: the object was replaced" in warning and "downloading the new version" in warning
    if cache:
        (cached,) = os.listdir(tmp_path / "c" / "shards")
        assert open(tmp_path / "c" / "shards" / cached, "rb").read() == open(root / "shard-000000.tar", "rb").read()


@pytest.mark.parametrize("cache", [True, False])
def test_a_shard_replaced_after_indexing_is_a_named_error_not_another_version(tmp_path, cache):
    """Its index is version 1's: a later download (an evicted cache entry) of version 2, or a byte
    range of it (no cache), must not be read with it."""
    root = tmp_path / "srv"
    root.mkdir()
    _shard(root / "shard-000000.tar", 0)
    _shard(tmp_path / "v2.tar", 10_000)
    with http_server(root, faults={"shard-000000.tar": ("swap", str(tmp_path / "unused"))}) as (base, hits):
        hits["shard-000000.tar"] = 1  # past the swapping first GET: serve the file as it is
        ds = fl.WebDataset(base + "/shard-000000.tar", cache_dir=str(tmp_path / "c"), image_key="ppm",
                           background_index=False, cache=cache)
        first = ds.read(0)
        for name in os.listdir(tmp_path / "c" / "shards") if cache else []:  # evicted
            os.remove(tmp_path / "c" / "shards" / name)
        os.replace(tmp_path / "v2.tar", root / "shard-000000.tar")
        assert first[1] == 0
        with pytest.raises(fl.DownloadError, match=r"shard-000000.tar: the object was replaced: it was version"):
            ds.read(0)


def _big_shard(tmp_path):
    write_shards(tmp_path / "big", [40], size=(96, 128))
    return tmp_path / "big", os.path.getsize(tmp_path / "big" / "shard-000000.tar")


@pytest.mark.slow  # 4-8 s: make test stays under 4 minutes (make test-slow runs it)
def test_a_server_that_keeps_half_stalling_is_given_up_on_after_retries_plus_one_stalls(tmp_path):
    """Each attempt gets half of what is left, then silence: progress every time, so the retries
    never ran out (27 stalls for a large shard); the stalls now count over the shard."""
    root, size = _big_shard(tmp_path)
    with http_server(root, faults={"shard-000000.tar": ("stall", 99, 30)}) as (base, hits):
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught, pytest.raises(
            fl.DownloadError, match=r"shard-000000.tar: the download broke off after \d+ of \d+ bytes \(4 stalls of 1 "
                                    r"s without a byte: at most retries \+ 1 = 4 per shard\)"
        ):
            warnings.simplefilter("always")
            fl.WebDataset(base + "/shard-000000.tar", cache_dir=str(tmp_path / "c"), stall_timeout=1, retries=3,
                          background_index=False)
        took = time.monotonic() - start
        asked = len(hits.ranges["shard-000000.tar"])
    assert asked == 4 and took < 4 * 1 + 6, (asked, took)  # bounded by (retries + 1) * stall_timeout, and backoff
    stalls = [str(w.message) for w in caught if "sent no byte" in str(w.message)]
    assert len(stalls) == 3, stalls  # the fourth is the error
    assert all(f"{base}/shard-000000.tar: the server sent no byte for 1 s at byte" in m for m in stalls), stalls
    assert "(stall 1 of at most 4 for this shard); asking again from byte" in stalls[0]


def test_a_stall_under_the_transports_own_timeout_is_retried_and_named(monkeypatch):
    """``stall_timeout=None`` leaves the waits to the transport: its time-out is a stall like
    ours, retried from the byte reached and named in words (it was a TypeError formatting None)."""
    from fastload.datasets.webdataset import remote
    from fastload.datasets.webdataset.index import ShardId

    data = bytes(range(256)) * 40

    class TimesOutOnce:  # a non-HTTP file (opened, then seeked): its first read times out
        timed_out = False

        def __init__(self):
            self.at = 0

        def seek(self, n):
            self.at = n

        def read(self, n):
            if not TimesOutOnce.timed_out:
                TimesOutOnce.timed_out = True
                raise TimeoutError("Read timeout on endpoint URL")
            chunk = data[self.at : self.at + n]
            self.at += len(chunk)
            return chunk

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class Store:
        protocol = "s3"

        def open(self, path, mode, block_size=None):
            return TimesOutOnce()

    monkeypatch.setattr(remote, "filesystem", lambda url, options, stall: (Store(), url))
    fetch = remote.Remote(stall_timeout=None, backoff_s=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = b"".join(fetch.stream(ShardId("s3://bucket/shard.tar", len(data), "v1")))
    assert got == data
    stalls = [str(w.message) for w in caught if "sent no byte" in str(w.message)]
    assert stalls == [
        f"fastload: s3://bucket/shard.tar: the server sent no byte for the transport's own time-out at byte 0 of "
        f"{len(data):,} (stall 1 of at most 6 for this shard); asking again from byte 0"
    ], stalls


def test_the_indexing_progress_counts_bytes_while_a_shard_downloads(tmp_path, capsys):
    root, size = _big_shard(tmp_path)
    with http_server(root, faults={"shard-000000.tar": ("stall", 1, 4)}) as (base, _):
        ds = fl.WebDataset(base + "/shard-000000.tar", cache_dir=str(tmp_path / "c"), stall_timeout=3.5)
        deadline = time.monotonic() + 10
        while ds._indexing.bytes[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        got, total = ds._indexing.bytes
        assert 0 < got < total == size and ds.indexed == (0, 1)  # half the shard, no shard done
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.wait_indexed()
    bar = capsys.readouterr().err
    assert "indexing shards" in bar and "0/1 shards" in bar and "kB" in bar, bar
