# XBench — two entry points that work on a fresh machine with Python 3.11 + pip:
#   make reproduce   set up .venv, run the whole benchmark on the embedded phantom default (CPU), write tables + figures
#   make test        set up .venv, run the test suite (incl. every notebook through papermill)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
CONFIG ?= xbench/configs/runs/phantom.yaml

.PHONY: setup reproduce test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

reproduce: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/xbench reproduce --config $(CONFIG) --figures-dir figures

test: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q --nbval-lax --nbval-current-env tests notebooks

bench: setup
	$(PY) benchmarks/bench_threshold_sweep.py

clean:
	rm -rf results .pytest_cache
