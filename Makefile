# make demo / make test: create .venv when absent, install with the pinned constraints, run.
# make demo installs only what the demo runs; make test (lint, docs, dist) adds the rest.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.demo-installed
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: demo test test-slow lint docs docs-check dist bench bench-ffcv gpu-wheels gpu-check clean

# The demo's needs: the package and its own requirements, and the real photographs the demo
# cuts its images from (scikit-image's data files only: no deps).
$(DEMO_STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e .
	$(PY) -m pip install -q --no-deps -c constraints.txt scikit-image
	@touch $(DEMO_STAMP)

# The rest: test, lint, docs and build extras, region decode, remote shards, and the
# references the tests compare pixels and policies with (test-only, pure-Python parts:
# torchvision's PyPI wheel is a CUDA build, so no deps; tests/refs.py stubs its compiled ops).
$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,docs,lint,build,roi,remote]'
	$(PY) -m pip install -q --no-deps -c constraints.txt torchvision timm
	@touch $(STAMP)

demo: $(DEMO_STAMP)
	@# A clone named fastload is imported in its place by Python run from the folder above it.
	@if [ "$(notdir $(CURDIR))" = fastload ]; then echo "note: this clone's folder is named fastload: Python \
	started in $(dir $(CURDIR)) imports the folder instead of the package ('module fastload has no \
	attribute ...'); run from inside it or elsewhere, or rename it (docs/troubleshooting.md)"; fi
	$(VENV)/bin/fastload demo

test: $(STAMP)
	$(PY) -m pytest -q

# Every test marked slow (docs build and browser check, examples under torchrun, the wheel in a
# clean venv, the GPU suite's dry run, spawned-worker benchmarks): .ci/run runs them after make test.
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 0 -m slow

# Static checks on the package, the examples and the tools: ruff (lint, then format
# check) and mypy, with the configuration in pyproject.toml.
LINTED := fastload examples tools scripts
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy

# The documentation site into site/ (git-ignored), strict: a broken link or reference fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The built site in headless Chromium (Debian's `chromium`): home page, a guide and an API
# page render with their navigation and search box; a screenshot goes to site-check/.
docs-check: docs
	$(PY) tools/docs_check.py site --screenshot site-check/home.png

# An sdist and a wheel into dist/.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist

# The bench extra (pyproject.toml), pinned: py-spy, and NVIDIA DALI for its CPU-only
# pipeline. DALI goes in without its declared CUDA codec extras (nvJPEG & co., not used
# on the CPU), then its small pure-Python dependencies.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt py-spy
	$(PY) -m pip install -q --no-deps -c constraints.txt nvidia-dali-cuda120 nvidia-nvimgcodec-cu12 nvidia-libnvcomp-cu12
	$(PY) -m pip install -q -c constraints.txt astunparse gast six optree nvtx makefun libcst
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) benchmarks/run_all.py

# FFCV 1.0.2 in a venv of its own ($(FFCV_VENV)), for bench_handoff_peers.py's FFCV row, which runs
# benchmarks/ffcv_peer.py with its python. Needs Debian's pkg-config, libturbojpeg0-dev and
# libopencv-dev first (apt-get install -y ...): FFCV's setup.py compiles against OpenCV and
# libturbojpeg found by pkg-config. Not part of make test or .ci/run. The same CPU torch as .venv
# (pinned: an unpinned torch is a CUDA build of GBs); FFCV without its declared deps (opencv-python
# wants a GUI stack: the headless build gives the same cv2; pytorch_pfn_extras only serves
# NormalizeImage, not used), then the ones it imports, at the versions that ran (numba 0.68.1
# takes numpy 2.4.6). Then the photo set's rows, FFCV's among them, 5 rounds (2 rounds took 5 min on
# the busy 2-core machine).
FFCV_VENV  ?= /work/ffcv-venv
FFCV_STAMP := $(FFCV_VENV)/.ffcv-installed
$(FFCV_STAMP):
	@pkg-config --exists opencv4 libturbojpeg || { echo "FFCV needs Debian's pkg-config, libturbojpeg0-dev \
	and libopencv-dev: apt-get install -y pkg-config libturbojpeg0-dev libopencv-dev"; exit 1; }
	@test -x $(FFCV_VENV)/bin/python || $(PYTHON) -m venv $(FFCV_VENV)
	$(FFCV_VENV)/bin/pip install -q torch==2.13.0 numpy==2.4.6 numba==0.68.1 llvmlite==0.50.0 pillow==13.0.0 \
	  opencv-python-headless==5.0.0.93 tqdm==4.70.1 psutil==7.2.2 terminaltables==3.1.10 fastargs==1.2.0 \
	  assertpy==1.1 setuptools
	$(FFCV_VENV)/bin/pip install -q --no-deps --no-build-isolation ffcv==1.0.2
	$(FFCV_VENV)/bin/python benchmarks/ffcv_peer.py --probe
	@touch $@

bench-ffcv: $(STAMP) $(FFCV_STAMP)
	$(PY) benchmarks/bench_handoff_peers.py --set photos --ffcv-python $(FFCV_VENV)/bin/python

# The wheels the GPU check needs and the GPU machine's image lacks (benchmarks/GPU.md), into
# $(WHEELS) (git-ignored): none of a package the image has; checked with the working tree
# against the 64 MiB a device call carries. GPU_PYTHON=3.11: for this machine's Python (the dry run).
GPU_PYTHON ?= 3.12
GPU_CUDA   ?= 13
WHEELS     ?= .whl
gpu-wheels:
	$(PYTHON) scripts/gpu_wheels.py --python $(GPU_PYTHON) --cuda $(GPU_CUDA) --dest $(WHEELS)

# The one device call (benchmarks/GPU.md): every step under its limit, all under BUDGET
# seconds (default 450); STEPS=train,h2d reruns only those (and what they need). Files into
# $OUT (default gpu-results). No venv: it runs the image's python3 (GPU_PY).
GPU_PY ?= python3
gpu-check:
	STEPS="$(STEPS)" WHEELS="$(WHEELS)" $(GPU_PY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) data .pytest_cache site site-check dist build
