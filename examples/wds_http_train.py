"""Convert an image folder to WebDataset shards, serve them over HTTP, and train from the URLs.

    python examples/wds_http_train.py DATA/train --shard-samples 1000 --epochs 2

Step 1 is ``tools/folder2wds.py`` in Python: ``fastload.convert.convert(..., "wds")`` writes
``shard-000000.tar``, ... (samples in a seeded random order, so a shard does not hold one
class) and ``shard.fastload.json`` (class names, samples per shard). Step 2 stands in for
your web server or object store: Python's ``http.server`` on 127.0.0.1, in a thread. Step 3
reads the shards by URL with a brace pattern (a web server cannot be listed); shards are
downloaded once per machine into the shard cache, indexed while they download. Needs
``pip install 'fastload[remote]'``.
"""

import argparse
import functools
import http.server
import os
import tempfile
import threading

import torch

import fastload as fl
from fastload.convert import convert


def serve(folder: str) -> http.server.ThreadingHTTPServer:
    """A static file server for ``folder`` on a free port of 127.0.0.1, in a daemon thread."""
    handler = functools.partial(QuietHandler, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # one line per request would drown the training log
        pass


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", help="an image folder: <class>/<image>")
    parser.add_argument("--out", default=None, help="where the shards go (default: a temporary folder)")
    parser.add_argument("--shard-samples", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--cache-dir", default=None, help="shard cache (default ~/.cache/fastload/webdataset)")
    args = parser.parse_args(argv)

    out = args.out or tempfile.mkdtemp(prefix="fastload-wds-")
    shards = os.path.join(out, "shards")
    made = convert(
        args.folder,
        shards,
        "wds",
        shard_samples=args.shard_samples,
        workers=args.workers,
        verify_output=True,
        overwrite=True,
        progress=False,
    )
    names = sorted(n for n in os.listdir(shards) if n.endswith(".tar"))
    print(f"converted {made['records']} images into {len(names)} shards at {shards}")

    server = serve(shards)
    host, port = server.server_address[:2]
    last = len(names) - 1
    url = f"http://{host}:{port}/shard-{{000000..{last:06d}}}.tar"
    print(f"serving them at {url}")
    try:
        dataset = fl.WebDataset(
            url, transform=fl.transforms.train(args.image_size), cache_dir=args.cache_dir or os.path.join(out, "cache")
        )
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=4),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, len(dataset.classes)),
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with fl.Loader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, seed=0) as loader:
            model.to(loader.device)
            for epoch in range(args.epochs):
                seen = 0
                for images, labels in loader:
                    loss = torch.nn.functional.cross_entropy(model(images), labels.to(loader.device))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    seen += len(labels)
                print(f"epoch {epoch}: {seen} samples from HTTP, loss {loss.item():.3f}")
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
