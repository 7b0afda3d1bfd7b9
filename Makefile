# make demo / make test: create .venv when absent, install with the pinned constraints, run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench gpu-suite clean

$(STAMP): pyproject.toml constraints.txt
	@sh scripts/ensure_turbojpeg.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,roi]'
	@# Real photographs for benchmarks, the demo and quality tests (data files only: no deps).
	$(PY) -m pip install -q --no-deps -c constraints.txt scikit-image
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fastload demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) data .pytest_cache
