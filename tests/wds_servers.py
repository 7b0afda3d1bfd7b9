"""Shards for the WebDataset tests, and the servers they are read from: all on 127.0.0.1,
started by the test itself, stopped when it ends.

- :func:`http_server`: Python's http.server over a folder; ``faults`` makes chosen paths
  fail: ``"cut"`` sends the headers and half the body, then closes the socket.
- :func:`s3_server`: moto's S3 server in a thread, with one bucket holding the files.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import tarfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from conftest import jpeg_bytes, make_image


def write_shards(root, sizes, *, start=0, writer="webdataset", size=(24, 32), label_ext="cls") -> list[str]:
    """Shards ``shard-000000.tar`` ... of ``sizes`` samples; sample n is key ``s<n>`` whose image
    is make_image(n) and whose target is n. ``writer``: the webdataset package, or "tar"
    (members written by the tar command from files on disk)."""
    import webdataset as wds

    os.makedirs(root, exist_ok=True)
    paths, n = [], start
    for s, count in enumerate(sizes):
        path = os.path.join(str(root), f"shard-{s:06d}.tar")
        samples = []
        for _ in range(count):
            target = str(n).encode() if label_ext != "json" else b'{"label": %d}' % n
            samples.append((f"s{n:05d}", jpeg_bytes(make_image(n, *size)), target))
            n += 1
        if writer == "webdataset":
            with wds.TarWriter(path) as w:
                for key, jpg, target in samples:
                    w.write({"__key__": key, "jpg": jpg, label_ext: target})
        else:
            _tar_command(path, samples, label_ext)
        paths.append(path)
    return paths


def _tar_command(path, samples, label_ext):
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for key, jpg, target in samples:
            for ext, data in (("jpg", jpg), (label_ext, target)):
                with open(os.path.join(tmp, f"{key}.{ext}"), "wb") as f:
                    f.write(data)
                names.append(f"{key}.{ext}")
        subprocess.run(["tar", "-cf", os.path.abspath(path), "-C", tmp, *names], check=True)


class Hits(dict):
    """GETs per path; ``ranges[path]``: the Range header of each GET (None: none sent)."""

    def __init__(self):
        super().__init__()
        self.ranges = {}


class _Handler(SimpleHTTPRequestHandler):
    """http.server with byte ranges (``bytes=N-`` and ``bytes=N-M``) and chosen faults."""

    faults: dict = {}
    hits: Hits = Hits()
    ranged: bool = True

    def log_message(self, *args):
        pass

    def _fault(self, name):
        fault = self.faults.get(name)
        if fault is not None and fault[0] in ("no-validators", "swap"):
            return fault
        return fault if fault is not None and self.hits.get(name, 0) <= fault[1] else None

    def _etag(self, path):
        """A strong ETag (of the content) for "swap" paths; None for the others (Last-Modified only)."""
        fault = self.faults.get(self.path.lstrip("/"))
        if fault is None or fault[0] != "swap":
            return None
        with open(path, "rb") as f:
            return '"%s"' % hashlib.sha1(f.read()).hexdigest()[:16]

    def do_HEAD(self):
        fault = self.faults.get(self.path.lstrip("/"))
        if fault is not None and fault[0] == "status" and self.hits.get(self.path.lstrip("/"), 0) < fault[1]:
            self.send_error(fault[2])
            return
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            super().do_HEAD()
            return
        extra = [] if fault is not None and fault[0] == "no-validators" else \
            [("Last-Modified", self.date_time_string(os.path.getmtime(path)))]
        etag = self._etag(path)
        if etag is not None:
            extra.insert(0, ("ETag", etag))
        self._headers_only(os.path.getsize(path), 200, extra)

    def _headers_only(self, length, status=200, extra=()):
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()

    def do_GET(self):
        name = self.path.lstrip("/")
        self.hits[name] = self.hits.get(name, 0) + 1
        self.hits.ranges.setdefault(name, []).append(self.headers.get("Range"))
        fault = self._fault(name)
        if fault is not None and fault[0] == "status":
            self.send_error(fault[2])
            return
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            super().do_GET()
            return
        with open(path, "rb") as f:
            data = f.read()
        start, status, extra = 0, 200, []
        asked = self.headers.get("Range", "")
        etag = self._etag(path)
        if etag is not None:
            extra.append(("ETag", etag))
            if self.headers.get("If-Range") not in (None, etag):  # RFC 9110: changed, so all of it
                asked = ""
        if self.ranged and asked.startswith("bytes="):
            lo, _, hi = asked[6:].partition("-")
            start, end = int(lo), (int(hi) + 1 if hi else len(data))
            extra = [("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")]
            data, status = data[start:end], 206
        if fault is not None and fault[0] == "swap":
            self._headers_only(len(data), status, extra)
            if self.hits[name] > 1:
                self.wfile.write(data)
                return
            self.wfile.write(data[: len(data) // 2])  # the first GET: half of version 1, then version 2
            self.wfile.flush()
            time.sleep(0.5)  # the client reads that half before the connection closes
            os.replace(fault[1], path)
            self.connection.shutdown(2)
            self.close_connection = True
            return
        if fault is None or fault[0] == "no-validators":
            if fault is None:
                extra.append(("Last-Modified", self.date_time_string(os.path.getmtime(path))))
            self._headers_only(len(data), status, extra)
            self.wfile.write(data)
            return
        self._headers_only(len(data), status, extra)
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        if fault[0] == "stall":  # half the body, then silence on an open connection
            time.sleep(fault[2])
        self.connection.shutdown(2)
        self.close_connection = True


@contextlib.contextmanager
def http_server(root, faults=None, ranged=True):
    """Serves ``root`` on 127.0.0.1; yields (base URL, a :class:`Hits`).

    ``faults``, {path: fault}: ``("cut", n)``: the first n GETs of that path send half the
    body asked for and close the connection; ``("stall", n, s)``: they send half, then
    nothing for s seconds; ``("status", n, code)``: the first n requests (HEAD and GET) are
    answered with that HTTP status; ``("no-validators", 0)``: every request answered without
    Last-Modified or ETag, always (the other paths send Last-Modified); ``("swap", other)``: the
    path has a strong ETag (honoured in If-Range), and the first GET sends half the body, then
    renames the file ``other`` over it (another version) and closes the connection. ``ranged=False``: Range headers are ignored
    (the whole file is sent, as by servers without range support).
    """
    handler = type("Handler", (_Handler,), {"faults": dict(faults or {}), "hits": Hits(), "ranged": ranged})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def s3_server(files, bucket="shards"):
    """moto's S3 server on 127.0.0.1 with ``bucket`` holding ``files`` (by base name); yields
    (``s3://bucket``, fsspec storage options). Skips the test when moto is not installed.

    moto keeps its buckets in the process, across servers: they are reset when the server stops."""
    import pytest

    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    start = time.monotonic()
    server.start()
    host, port = server.get_host_and_port()
    try:
        endpoint = f"http://{host}:{port}"
        creds = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}
        client = boto3.client("s3", endpoint_url=endpoint, **creds)
        client.create_bucket(Bucket=bucket)
        for path in files:
            client.upload_file(str(path), bucket, os.path.basename(path))
        assert time.monotonic() - start < 30, "the S3 server took too long to start"
        options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint,
                                                                       "region_name": "us-east-1"}}
        yield f"s3://{bucket}", options
    finally:
        try:
            import urllib.request

            urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST"),
                                   timeout=10).close()
        finally:
            server.stop()


def truncate(path, keep):
    """Cuts the file at ``path`` to ``keep`` bytes."""
    with open(path, "r+b") as f:
        f.truncate(keep)


def tar_offsets(path):
    """{member name: data offset} of a tar file (by Python's tarfile, for test expectations)."""
    with tarfile.open(path) as t:
        return {m.name: m.offset_data for m in t.getmembers()}
