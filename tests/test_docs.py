"""The documentation is tested: the site builds strictly, every Python block of docs/ runs
(on tiny data, CPU) unless marked ``<!-- notest: why -->``, every ``diff-of`` diff matches
its file, the API reference covers ``fastload.__all__``, and the built site renders in
headless Chromium with its navigation and search box (tools/docs_check.py)."""

import inspect
import os
import re
import shutil
import subprocess
import sys

import docs_blocks
import pytest
from conftest import write_folder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PAGES = docs_blocks.pages()
RUNNABLE = [p for p in PAGES if docs_blocks.script(p)]


def _mkdocs(site):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: make test installs it")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return _mkdocs(tmp_path_factory.mktemp("site"))


def test_site_builds_strictly_with_every_page(site):
    for page in PAGES:
        if page.endswith("index.md"):
            html = page[: -len("index.md")] + "index.html"
        else:
            html = page[: -len(".md")] + "/index.html"
        assert (site / html).exists(), f"{page} was not built"
    assert (site / "benchmarks" / "RESULTS" / "index.html").exists()
    raw = site / "benchmarks" / "results" / "2026-11-24-handoff" / "bench_loader.txt"
    assert (
        raw.read_bytes()
        == open(os.path.join(ROOT, "benchmarks", "results", "2026-11-24-handoff", "bench_loader.txt"), "rb").read()
    )


def test_api_reference_covers_the_public_api(site):
    import fastload

    html = (site / "reference" / "index.html").read_text()
    names = [n for n in fastload.__all__ if not inspect.ismodule(getattr(fastload, n))]  # modules: own pages
    missing = [n for n in names if f'id="fastload.{n}"' not in html]
    assert not missing, f"not in the API reference: {missing}"
    modules = [n for n in fastload.__all__ if n not in names]
    pageless = [n for n in modules if not (site / "reference" / n / "index.html").exists()]
    assert not pageless, f"public modules without a docs/reference/<name>.md page (::: fastload.<name>): {pageless}"
    loader_options = (site / "guides" / "loader-options" / "index.html").read_text()
    for field in ("batch_size", "num_workers", "prefetch_factor", "on_error", "stall_warning"):
        assert f"fastload.LoaderConfig.{field}" in loader_options or field in loader_options, field


def test_every_block_is_run_or_marked():
    """Fences are parsed as the site shows them; a marker must say why, and a python
    block without a marker is in a page's script."""
    for page in PAGES:
        for b in docs_blocks.blocks(page):
            if b.marker:
                assert b.marker_arg, f"{page}:{b.line}: a {b.marker} marker needs a reason or a path"
            if b.lang in ("python", "py") and b.marker is None:
                assert b.code in docs_blocks.script(page), f"{page}:{b.line}"
            if b.lang in ("python", "py") and b.marker == "diff-of":
                raise AssertionError(f"{page}:{b.line}: diff-of goes on a ```diff block")


def _squeezed(code):
    """Code without whitespace or trailing commas: the same under any line wrapping (ruff format)."""
    return re.sub(r"\s+", "", code).replace(",)", ")")


@pytest.mark.parametrize(
    "page", [p for p in [*PAGES, "../README.md"] if any(b.marker == "diff-of" for b in docs_blocks.blocks(p))]
)
def test_diffs_show_the_files_as_they_are(page):
    """Each + or context line of a diff-of diff is in the file, whatever its wrapping there."""
    for b in docs_blocks.blocks(page):
        if b.marker != "diff-of":
            continue
        with open(os.path.join(ROOT, b.marker_arg), encoding="utf-8") as f:
            have = _squeezed(f.read())
        for n, line in enumerate(b.code.splitlines()):
            if line.startswith(("+", " ")) and line[1:].strip():
                assert _squeezed(line[1:]) in have, f"{page}:{b.line + 1 + n}: not in {b.marker_arg}: {line!r}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """What the docs' snippets read: data/train and data/val (ImageFolder), data/train.txt,
    and the folder converted to LMDB, TFRecord and WebDataset shards."""
    from fastload.convert import convert

    root = tmp_path_factory.mktemp("docs_work")
    write_folder(root / "data" / "train", num_classes=2, per_class=8, size=(64, 80))
    write_folder(root / "data" / "val", num_classes=2, per_class=4, size=(64, 80), seed=1)
    with open(root / "data" / "train.txt", "w") as f:
        for c in range(2):
            for i in range(8):
                f.write(f"c{c}/{i:03d}.jpg {c}\n")
    for fmt, dst, extra in (
        ("lmdb", "train.lmdb", {}),
        ("tfrecord", "train-tfr", {"shards": 2}),
        ("wds", "train-wds", {"shard_samples": 5}),
    ):
        convert(str(root / "data" / "train"), str(root / "data" / dst), fmt, workers=1, progress=False, **extra)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE)
def test_python_blocks_run(page, workdir, tmp_path):
    """The page's python blocks, in order, in one process and namespace, in a copy of the
    tiny data (a snippet may write files), on the CPU."""
    work = tmp_path / "work"
    shutil.copytree(workdir, work)
    script = work / "page.py"
    script.write_text(docs_blocks.script(page))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        "CUDA_VISIBLE_DEVICES": "",
        "FASTLOAD_NO_CALIBRATION": "1",
    }
    proc = subprocess.run([sys.executable, "page.py"], cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"{page}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.slow
def test_site_renders_in_chromium(site, tmp_path):
    """Home page, a guide and an API page, in a real browser: navigation, search box, content."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run installs it)")
    shot = tmp_path / "home.png"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "docs_check.py"), str(site), "--screenshot", str(shot)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^3 pages ok", proc.stdout, re.M), proc.stdout
    assert shot.exists() and shot.stat().st_size > 10_000  # a rendered page, not a blank one


def test_no_file_holds_a_merge_conflict_marker():
    """A conflict resolved by hand and committed with its markers reads as two versions at once
    (benchmarks/RESULTS.md did)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    markers = ("<" * 7 + " ", ">" * 7 + " ")  # spelled so this file holds none
    found = []
    for name in files:
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                found += [f"{name}:{n}" for n, line in enumerate(f, 1) if line.startswith(markers)]
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or removed in the work tree
    assert not found, f"merge-conflict markers: {found}"


def test_no_page_sizes_dev_shm_for_the_batch_buffers():
    """The process backend's batch buffers are memfd segments, not in /dev/shm (tests/test_shm.py:
    a 64 MB /dev/shm holds no batch): advice to raise --shm-size for them, or to read a Bus
    error as a full /dev/shm, is stale (issue 32, item 17)."""
    stale = re.compile(r"--shm-size=\d|slots (stay|live) in `?/dev/shm|Bus error`?\*?\*?: shared memory is full")
    found = [f"{page}:{n}" for page in [*PAGES, "../README.md"]
             for n, line in enumerate(open(os.path.join(docs_blocks.DOCS, page), encoding="utf-8"), 1)
             if stale.search(line)]
    assert not found, f"stale /dev/shm advice: {found}"


def test_code_the_tests_do_not_run_still_parses():
    """A ``notest`` python block (a part of someone else's script, as the migration guides
    show) is at least valid Python once dedented."""
    import ast
    import textwrap

    for page in PAGES:
        for b in docs_blocks.blocks(page):
            if b.lang in ("python", "py") and b.marker == "notest":
                try:
                    ast.parse(textwrap.dedent(b.code))
                except SyntaxError as e:
                    raise AssertionError(f"{page}:{b.line}: {e}") from None


@pytest.mark.parametrize("page", [p for p in PAGES if p.startswith("migration/")])
def test_a_guide_that_adds_fl_code_to_a_file_adds_its_import(page):
    """The code a migration guide adds to a file (``+`` lines of its diffs, its python blocks)
    imports fastload where it uses ``fl.``: a port made by following it must not start with a
    NameError. A section edits the file its ``##`` heading names (`presets.py`), else the script."""
    with open(os.path.join(docs_blocks.DOCS, page), encoding="utf-8") as f:
        lines = f.read().split("\n")
    added: dict = {}
    for b in docs_blocks.blocks(page):
        heading = next((line for line in reversed(lines[: b.line]) if line.startswith("## ")), "")
        target = (re.findall(r"`?([\w./-]+\.py)`?", heading) or ["the script"])[0]
        if b.lang == "diff":
            added.setdefault(target, []).extend(line[1:] for line in b.code.splitlines() if line.startswith("+"))
        elif b.lang in ("python", "py"):
            added.setdefault(target, []).extend(b.code.splitlines())
    for target, code in added.items():
        if any(re.search(r"\bfl\.", line) for line in code):
            assert any(line.strip() == "import fastload as fl" for line in code), f"{page}: {target} uses fl. unimported"


def test_the_clone_step_names_a_folder_python_does_not_import_as_the_package():
    """A plain clone is a folder named fastload: Python started beside it imports the folder (a
    namespace package, ahead of the editable install) and fl.ImageFolder is missing."""
    clones = [(page, line) for page in [*PAGES, "../README.md"]
              for line in open(os.path.join(docs_blocks.DOCS, page), encoding="utf-8") if "git clone " in line]
    assert clones, "no clone step found"
    for page, line in clones:
        words = line.split("git clone ", 1)[1].split("&&")[0].split()
        folder = words[-1] if len(words) > 1 else None
        assert folder not in (None, "fastload"), f"{page}: {line.strip()!r} clones into a folder named fastload"

