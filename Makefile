# XBench — two entry points that work on a fresh machine with Python 3.11 + pip:
#   make reproduce   set up .venv, run the whole benchmark on the embedded phantom default (CPU), write tables + figures
#   make test        set up .venv, lint (ruff), run the test suite on two workers (incl. doctests and every notebook
#                    through papermill, on a phantom slice: tests/notebooks/test_notebooks.py)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
CONFIG ?= xbench/configs/runs/phantom.yaml
# pytest-xdist workers of `make test`: whole files per worker, the longest first (tests/conftest.py FIRST)
TEST_WORKERS ?= 2

.PHONY: setup reproduce test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -e '.[dev]'  # quiet: setuptools' editable-install warning block
	$(PY) -m pip install --quiet --no-deps 'quantus==0.6.0'  # test-only; --no-deps: see pyproject.toml [dev]
	touch $@

reproduce: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/xbench reproduce --config $(CONFIG) --figures-dir figures

test: setup
	$(VENV)/bin/ruff check xbench tests
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --doctest-modules xbench tests

bench: setup
	$(PY) benchmarks/bench_threshold_sweep.py

clean:
	rm -rf results .pytest_cache
