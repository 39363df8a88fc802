# pgtrickle developer entry points. `make demo` and `make test` do all set-up.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python

.PHONY: setup demo test test-unit lint bench clean

setup: $(VENV)/.installed
	@scripts/ensure-jdbc.sh

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

demo: setup
	$(VENV)/bin/pgtrickle demo

test: setup
	$(PY) -m pytest

test-unit: setup
	$(PY) -m pytest tests/unit

bench: setup
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/full_refresh.py
	$(PY) benchmarks/differential.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
