# make demo / make test: create .venv when absent, install with the pinned constraints, run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: demo test bench gpu-wheels gpu-suite clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,roi,remote]'
	@# Real photographs for benchmarks, the demo and quality tests (data files only: no deps).
	$(PY) -m pip install -q --no-deps -c constraints.txt scikit-image
	@# The references the tests compare pixels and policies with (test-only, pure-Python parts:
	@# torchvision's wheel is a CUDA build, so no deps; tests/refs.py stubs its compiled ops).
	$(PY) -m pip install -q --no-deps -c constraints.txt torchvision timm
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fastload demo

test: $(STAMP)
	$(PY) -m pytest -q

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

# What the GPU machine lacks, for its Python and CUDA (benchmarks/GPU.md): wheels into
# $(WHEELS) (git-ignored) plus libturbojpeg, checked against the 64 MiB a call carries.
# GPU_PYTHON=3.11 fetches for this machine's Python instead (the dry run, tests/test_gpu_suite.py).
GPU_PYTHON ?= 3.12
GPU_CUDA   ?= 13
WHEELS     ?= .whl
gpu-wheels:
	$(PYTHON) scripts/gpu_wheels.py --python $(GPU_PYTHON) --cuda $(GPU_CUDA) --dest $(WHEELS)

# The dry run of the device calls here (no GPU): OUT=... (default gpu-results).
gpu-suite: $(STAMP)
	PYTHON=$(PY) WHEELS=$(WHEELS) bash benchmarks/gpu_suite.sh all

clean:
	rm -rf $(VENV) data .pytest_cache
