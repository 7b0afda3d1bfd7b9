"""WebDataset over HTTP (http.server) and S3 (moto's server), both on 127.0.0.1: one download
per shard per machine, the bounded cache, and the faults: a missing shard, a truncated
one, a connection cut mid-download, a full cache."""

import errno
import os
import threading
import time

import pytest

import fastload as fl
from fastload.datasets.webdataset import cache as cache_module
from fastload.datasets.webdataset.cache import ShardCache
from fastload.datasets.webdataset.remote import Remote
from fastload.datasets.webdataset.store import ShardStore

from wds_servers import http_server, s3_server, tar_offsets, truncate, write_shards

SIZES = [6, 5, 7, 6]  # 24 samples
URLS = "/shard-{000000..000003}.tar"
OPTS = dict(batch_size=4, device="cpu", normalize=False, seed=1)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def data(tmp_path):
    write_shards(tmp_path / "data", SIZES)
    return tmp_path / "data"


def _ds(url, cache_dir, **kw):
    return fl.WebDataset(url, fl.transforms.eval(16, resize=20), cache_dir=str(cache_dir), **{"retries": 2, **kw})


def _epoch(ds, **kw):
    with fl.Loader(ds, **{**OPTS, **kw}) as loader:
        batches = [y.tolist() for _, y in loader]
        return batches, len(loader), list(loader.skipped)


def _tars(hits):
    return {name: n for name, n in hits.items() if name.endswith(".tar")}  # leaves out the sidecar's lookups


def _cached(root):
    return tuple(sorted(os.listdir(os.path.join(root, d))) if os.path.isdir(os.path.join(root, d)) else []
                 for d in ("shards", "partial"))


@pytest.mark.parametrize("cache", [True, False])
def test_http_each_sample_once_and_one_download_per_shard(data, tmp_path, cache):
    with http_server(data) as (base, hits):
        ds = _ds(base + URLS, tmp_path / "c", cache=cache, window=2)
        batches, n, _ = _epoch(ds, num_workers=2, shuffle=True)
        assert sorted(sum(batches, [])) == list(range(24)) and len(batches) == n
        if cache:  # indexed while downloaded into the cache; the epoch reads the cached copies
            assert _tars(hits) == {f"shard-{i:06d}.tar": 1 for i in range(4)}
            assert len(_cached(tmp_path / "c")[0]) == 4
        else:  # indexed by streaming each shard once, then the epoch's byte ranges
            assert _cached(tmp_path / "c") == ([], [])


def test_s3_each_sample_once(data, tmp_path):
    files = sorted(str(p) for p in data.iterdir())
    with s3_server(files) as (bucket, options):
        ds = _ds(bucket + "/*.tar", tmp_path / "c", storage_options=options)
        assert ds.urls == [f"{bucket}/shard-{i:06d}.tar" for i in range(4)]
        batches, n, _ = _epoch(ds, num_workers=2, shuffle=True)
        assert sorted(sum(batches, [])) == list(range(24)) and len(batches) == n
        direct = _ds(bucket + URLS, tmp_path / "d", storage_options=options, cache=False)
        assert [y for _, y in direct] == list(range(24))


def test_concurrent_readers_download_a_shard_once(data, tmp_path):
    with http_server(data) as (base, hits):
        ds = _ds(base + URLS, tmp_path / "c", cache=False)  # indexes: one GET per shard
        store = ShardStore(Remote(retries=0), ShardCache(str(tmp_path / "shared"), 1 << 30), ds.store.index_dir)
        paths = []
        threads = [threading.Thread(target=lambda: paths.append([store.local_file(s) for s in ds.table.shards]))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(paths) == 4 and all(p == paths[0] for p in paths)
        assert _tars(hits) == {f"shard-{i:06d}.tar": 2 for i in range(4)}  # the index's GET and one download


def test_a_shard_another_process_cached_is_indexed_from_the_cache(data, tmp_path):
    with http_server(data) as (base, hits):
        first = _ds(base + URLS, tmp_path / "c")  # indexed while downloaded into the cache: one GET per shard
        other = ShardStore(Remote(retries=0), first.store.cache, str(tmp_path / "other-index"))
        indexes = [other.index(s) for s in first.table.shards]  # no stored index: it scans the cached copies
        assert _tars(hits) == {f"shard-{i:06d}.tar": 1 for i in range(4)}
        assert [len(ix) for ix in indexes] == SIZES


def test_a_missing_shard(data, tmp_path):
    with http_server(data) as (base, _):
        with pytest.raises(FileNotFoundError, match=r"shard-000004.tar: no such shard .*at byte 0"):
            _ds(base + "/shard-{000000..000004}.tar", tmp_path / "c")
        ds = _ds(base + URLS, tmp_path / "c", cache=False)
        ds.wait_indexed()
        os.remove(data / "shard-000002.tar")  # gone after it was indexed
        with pytest.raises(Exception, match=r"shard-000002.tar: no such shard"):
            _epoch(ds, num_workers=0)
        batches, n, skipped = _epoch(ds, num_workers=2, on_error="skip")
        assert len(batches) == n and all(len(b) == 4 for b in batches[:-1])
        assert sorted(s.index for s in skipped) == list(range(11, 18))


def test_a_truncated_shard(data, tmp_path):
    path = data / "shard-000001.tar"
    cut_at = tar_offsets(path)["s00008.jpg"] + 5
    truncate(path, cut_at)
    with http_server(data) as (base, _):
        ds = _ds(base + URLS, tmp_path / "c")  # indexed in the background: the first use tells
        with pytest.warns(RuntimeWarning, match=r"shard-000001.tar: member 's00008.jpg' needs \d+ bytes"):
            assert len(ds) == 24 - 2  # samples 9 and 10 are beyond the cut; 8 is an error record
        with pytest.raises(Exception, match=r"shard-000001.tar.*sample 's00008' is cut off.*at byte \d+"):
            _epoch(ds, num_workers=0)
        full = _ds(base + URLS, tmp_path / "d", cache=False)
        full.wait_indexed()  # indexed in the background: wait before cutting a shard
        truncate(data / "shard-000003.tar", 2000)  # cut after it was indexed
        batches, n, skipped = _epoch(full, num_workers=0, on_error="skip")
        # shard 1 now holds samples 6-8 (8 cut off), so shard 3 holds 16-21: its reads fail
        assert len(batches) == n and {s.index for s in skipped} == {8, *range(16, 22)}
        assert all("shard-000003.tar" in s.error and "at byte" in s.error for s in skipped if s.index >= 16)


def test_a_connection_cut_mid_download(data, tmp_path):
    size = os.path.getsize(data / "shard-000001.tar")
    with http_server(data, faults={"shard-000001.tar": ("cut", 1)}) as (base, hits):
        ds = _ds(base + URLS, tmp_path / "c")  # cut once: the retry goes on
        assert len(ds) == 24 and hits["shard-000001.tar"] == 2 and [y for _, y in ds] == list(range(24))
    with http_server(data, faults={"shard-000001.tar": ("cut", 99)}) as (base, hits):
        # How much of the cut response the client hands over before its error depends on timing.
        with pytest.raises(fl.DownloadError, match=rf"shard-000001.tar: the download broke off after \d+ "
                                                   rf"of {size} bytes.*at byte \d+") as info:
            len(_ds(base + URLS, tmp_path / "e"))
        # retries=2: three attempts in a row without progress end it; whether an attempt gets the
        # half before the cut depends on timing, progress earns a fresh set of retries (each
        # from the byte reached), and a retry on a dropped pooled connection may never reach
        # the server.
        starts = [0 if r is None else int(r[6:-1]) for r in hits.ranges["shard-000001.tar"]]
        assert len(starts) >= 2 and starts == sorted(starts) and starts[-1] == info.value.offset
        assert len(starts) <= 3 * (len(set(starts)) + 1)
        cached, partial = _cached(tmp_path / "e")
        assert partial == [] and len(cached) == 3  # the other shards: a partial download never enters the cache


def test_the_cache_evicts_the_least_recently_used_and_takes_only_complete_shards(tmp_path):
    from fastload.datasets.webdataset import ShardId

    cache = ShardCache(str(tmp_path / "c"), 250)
    shards = [ShardId(f"http://h/{k}.tar", 100, "v") for k in "abcd"]
    for shard in shards[:2]:
        cache.fill(shard, lambda sink: sink(b"x" * 100))
    os.utime(cache.path(shards[0]), ns=(1, 1))
    os.utime(cache.path(shards[1]), ns=(2, 2))
    assert cache.get(shards[0]) is not None  # used now: b is the least recently used
    cache.fill(shards[2], lambda sink: sink(b"y" * 100))
    assert [cache.get(s) is not None for s in shards[:3]] == [True, False, True] and cache.usage() == 200
    with pytest.raises(fl.datasets.webdataset.CacheError, match="the download has 60 bytes, the shard 100"):
        cache.fill(shards[3], lambda sink: sink(b"z" * 60))
    assert cache.get(shards[3]) is None and os.listdir(tmp_path / "c" / "partial") == []


def test_a_full_cache(data, tmp_path, monkeypatch):
    sizes = sorted(os.path.getsize(p) for p in data.iterdir())
    limit = sizes[0] + sizes[1]  # room for two of the four shards
    with http_server(data) as (base, hits):
        ds = _ds(base + URLS, tmp_path / "c", cache_limit=limit, window=1)
        for _ in range(2):
            batches, _, _ = _epoch(ds, num_workers=0, shuffle=True)
            assert sorted(sum(batches, [])) == list(range(24))
            assert ds.store.cache.usage() <= limit and _cached(tmp_path / "c")[1] == []
        assert sum(_tars(hits).values()) > 4  # evicted shards were downloaded again
        with pytest.warns(RuntimeWarning, match="exceed cache_limit=100 bytes"):
            small = _ds(base + URLS, tmp_path / "s", cache_limit=100)
        assert [y for _, y in small] == list(range(24)) and _cached(tmp_path / "s") == ([], [])

        real_open = open

        def disk_full(path, mode="r", *a, **kw):
            f = real_open(path, mode, *a, **kw)
            if "partial" in str(path):
                def write(chunk):
                    raise OSError(errno.ENOSPC, "No space left on device")
                f.write = write
            return f

        monkeypatch.setattr(cache_module, "open", disk_full, raising=False)
        with pytest.warns(RuntimeWarning, match="writing to the shard cache .* failed.*without the cache from now on"):
            full = _ds(base + URLS, tmp_path / "f")
            len(full)  # indexed (and downloaded) in the background until then
        assert [y for _, y in full] == list(range(24)) and _cached(tmp_path / "f") == ([], [])


def _big_shard(tmp_path):
    """One shard of 40 samples of 96x128 (a few hundred KB: its half arrives before a stall)."""
    write_shards(tmp_path / "big", [40], size=(96, 128))
    return tmp_path / "big", os.path.getsize(tmp_path / "big" / "shard-000000.tar")


@pytest.mark.parametrize("ranged", [True, False])
def test_a_stalled_download_goes_on_from_the_byte_it_reached(tmp_path, ranged):
    root, size = _big_shard(tmp_path)
    with http_server(root, faults={"shard-000000.tar": ("stall", 1, 6)}, ranged=ranged) as (base, hits):
        start = time.monotonic()
        ds = _ds(base + "/shard-000000.tar", tmp_path / "c", stall_timeout=1)
        took = time.monotonic() - start
        assert [y for _, y in ds] == list(range(40))
        asked = hits.ranges["shard-000000.tar"]
        assert len(asked) == 2 and asked[0] is None  # the first GET from byte 0, the retry from where it stopped
        reached = int(asked[1].removeprefix("bytes=").removesuffix("-"))
        assert size // 4 <= reached <= size // 2  # the half sent before the stall (or most of it)
        assert took < 5, f"the stall was not cut short by stall_timeout=1 ({took:.1f} s)"


def test_download_timeout_bounds_a_download_that_keeps_stalling(tmp_path):
    root, size = _big_shard(tmp_path)
    with http_server(root, faults={"shard-000000.tar": ("stall", 99, 6)}) as (base, hits):
        start = time.monotonic()
        with pytest.raises(fl.DownloadError, match=rf"shard-000000.tar: the download of {size} bytes took longer "
                                                   r"than download_timeout=2.5s \(at byte \d+\)"):
            _ds(base + "/shard-000000.tar", tmp_path / "c", stall_timeout=1, download_timeout=2.5, retries=20,
                background_index=False)
        assert time.monotonic() - start < 5
        assert len(hits.ranges["shard-000000.tar"]) >= 2  # each stall was retried (from the byte reached)
    with pytest.raises(ValueError, match="stall_timeout must be a number of seconds > 0 or None, got 0"):
        _ds("x.tar", tmp_path / "c", stall_timeout=0)


def test_server_errors_are_retried_and_never_called_missing(data, tmp_path):
    with http_server(data, faults={"shard-000002.tar": ("status", 2, 503)}) as (base, hits):
        ds = _ds(base + URLS, tmp_path / "c")  # retries=2: the third attempt gets through
        assert [y for _, y in ds] == list(range(24)) and hits["shard-000002.tar"] == 3
    with http_server(data, faults={"shard-000002.tar": ("status", 99, 500)}) as (base, hits):
        with pytest.raises(fl.DownloadError, match=r"shard-000002.tar: asking for the size failed after 3 "
                                                   r"attempt\(s\): HTTP 500") as info:
            _ds(base + URLS, tmp_path / "d")
        assert "no such shard" not in str(info.value)
    with http_server(data, faults={"shard-000002.tar": ("status", 99, 403)}) as (base, hits):
        with pytest.raises(fl.DownloadError, match=r"failed after 1 attempt\(s\): HTTP 403"):
            _ds(base + URLS, tmp_path / "e")  # a refusal is not retried
    with http_server(data) as (base, _):
        with pytest.raises(FileNotFoundError, match=r"shard-000009.tar: no such shard"):
            _ds(base + "/shard-000009.tar", tmp_path / "f")


def _relabel(path, name, new):
    """Rewrites member ``name``'s data in place (same size, same mtime): a replaced shard."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(tar_offsets(path)[name])
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("validators", [True, False])
def test_a_replaced_shard_is_never_served_from_a_stale_cache(data, tmp_path, validators):
    faults = {} if validators else {f"shard-{i:06d}.tar": ("no-validators", 0) for i in range(4)}
    with http_server(data, faults=faults) as (base, hits):
        first = _ds(base + URLS, tmp_path / "c")
        assert [y for _, y in first] == list(range(24)) and sum(_tars(hits).values()) == 4
        again = _ds(base + URLS, tmp_path / "c")
        if validators:  # the same content by its Last-Modified: neither indexed nor downloaded again
            assert [y for _, y in again] == list(range(24)) and sum(_tars(hits).values()) == 4
        else:  # nothing tells contents apart: each dataset downloads its own copy once
            assert [y for _, y in again] == list(range(24)) and sum(_tars(hits).values()) == 8
        assert [y for _, y in first] == list(range(24)) and sum(_tars(hits).values()) == 4 + 4 * (not validators)
        _relabel(data / "shard-000001.tar", "s00006.cls", b"9")  # same size, same mtime, new content
        if validators:
            st = os.stat(data / "shard-000001.tar")  # a real replacement changes Last-Modified (1 s resolution)
            os.utime(data / "shard-000001.tar", (st.st_atime + 10, st.st_mtime + 10))
        replaced = _ds(base + URLS, tmp_path / "c")
        assert [y for _, y in replaced][6] == 9


def test_the_constructor_does_not_wait_for_the_downloads(data, tmp_path):
    faults = {"shard-000002.tar": ("stall", 1, 3)}
    with http_server(data, faults=faults) as (base, hits):
        start = time.monotonic()
        ds = _ds(base + URLS, tmp_path / "c", stall_timeout=1.5)  # shard 2's first download stalls for 1.5 s
        assert time.monotonic() - start < 1.2 and ds.indexed[0] < 4 and ds.indexed[1] == 4
        with pytest.raises(TimeoutError, match=r"indexing 4 shard\(s\) did not finish in 0.2 s"):
            ds.wait_indexed(0.2)
        # a Loader forks its workers before it asks for len(): the fork waits for the indexes
        batches, n, _ = _epoch(ds, num_workers=2, shuffle=True)
        assert sorted(sum(batches, [])) == list(range(24)) and len(batches) == n and ds.indexed == (4, 4)


def test_persistent_workers_over_http_are_kept_for_every_epoch(data, tmp_path):
    """The index a remote WebDataset finishes as its workers start is no change to the dataset:
    the workers it started with serve every epoch (the snapshot is taken after the start)."""
    with http_server(data) as (base, _):
        ds = _ds(base + URLS, tmp_path / "c")
        with fl.Loader(ds, **OPTS, num_workers=2, shuffle=True) as loader:
            for epoch in range(3):
                loader.set_epoch(epoch)
                assert sorted(y for _, batch in loader for y in batch.tolist()) == list(range(24))
