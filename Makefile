# pgtrickle developer entry points. `make demo` and `make test` do all set-up.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python

.PHONY: setup demo test test-unit lint bench clean

setup: $(VENV)/.installed
	@scripts/ensure-jdbc.sh
	@scripts/ensure-promtool.sh

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

# Static checks, all of which must pass (CI runs this before the tests): formatting, lint, types and the
# import layering of docs/ARCHITECTURE.md ("Layers"). PYTHONPATH=src: check this tree, not an installed copy.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check src
	$(VENV)/bin/ruff check src
	$(VENV)/bin/mypy src
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-logo

# The benchmark suite: `make bench` (quick), `make bench PRESET=standard`, `make bench PRESET=full`
# (100M rows: hours and ~60 GiB; see `$(PY) benchmarks/suite.py --preset full --dry-run`).
PRESET ?= quick
bench: setup
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/suite.py --preset $(PRESET) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
