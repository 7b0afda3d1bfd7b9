"""Opens the built docs site in headless Chromium and checks what a reader sees.

    python tools/docs_check.py SITE_DIR [--screenshot OUT.png]

The site is served over HTTP on 127.0.0.1 (as a reader gets it, so the search index and
scripts load as they would). For the home page, a guide and an API page, Chromium's DOM
after the page's scripts ran must hold the navigation (with links to the other pages),
the search box, the page's own content, and the copy buttons the theme's script adds to
code blocks (proof that the scripts ran). Prints one line per page and "3 pages ok";
exits 1 naming what is missing. Needs Debian's ``chromium`` package (or Chrome).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading

# page -> strings its rendered DOM must contain besides the common ones
PAGES = {
    "": ['<h1 id="fastload">fastload', "one-line swap"],
    "guides/datasets/": ["Image folders and list files", 'id="your-own-dataset"'],
    "reference/": ['id="fastload.Loader"', 'id="fastload.LoaderConfig"', 'id="fastload.ImageFolder"'],
}
COMMON = {
    "navigation": 'class="md-nav',
    "a link to Getting started": "getting-started/",
    "a link to the API reference": "reference/",
    "the search box": 'class="md-search__input"',
    "copy buttons added by the theme's script": "md-code__button",
}


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("headless Chromium not found: apt-get install chromium")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requested: list[str] = []

    def log_message(self, format, *args):
        _Quiet.requested.append(self.path)


def _browser(args: list[str], profile: str) -> str:
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site", help="the built site (mkdocs build --site-dir)")
    parser.add_argument("--screenshot", help="PNG of the home page, 1280×900")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.site, "index.html")):
        raise SystemExit(f"{args.site} holds no index.html: run make docs first")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=args.site))
    server.timeout = 10
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    failed = []
    try:
        with tempfile.TemporaryDirectory(prefix="fastload-docs-check-") as profile:
            for page, own in PAGES.items():
                dom = _browser(["--dump-dom", base + page], profile)
                missing = [what for what, s in COMMON.items() if s not in dom] + [s for s in own if s not in dom]
                print(f"{page or '(home)'}: {'ok' if not missing else 'MISSING ' + '; '.join(missing)}")
                if missing:
                    failed.append(page)
            if args.screenshot:
                os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
                _browser(
                    [
                        f"--screenshot={os.path.abspath(args.screenshot)}",
                        "--window-size=1280,900",
                        "--hide-scrollbars",
                        base,
                    ],
                    profile,
                )
                print(f"screenshot: {args.screenshot}")
    finally:
        server.shutdown()
        server.server_close()
    if failed:
        return 1
    print(f"{len(PAGES)} pages ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
