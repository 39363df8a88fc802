# pgtrickle developer entry points. `make demo` and `make test` do all set-up.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python

.PHONY: setup demo test test-unit test-integration soak stress lint bench clean

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

# Everything, the short soak (30 s of writes) and short stress runs included; docs/TESTING.md.
# In TEST_WORKERS pytest-xdist workers (each with its own PostgreSQL and SparkSession), the heaviest
# tests handed out first (tests/conftest.py); the Spark Connect tests share one worker (one server).
# `make test TEST_WORKERS=0` runs serially. PYTEST_ARGS passes options on (`PYTEST_ARGS="-k wal"`).
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
test: setup
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# No JVM, no database (tests/unit/conftest.py fails a unit test that starts either): well under a minute.
test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest $(XDIST) tests/integration $(PYTEST_ARGS)

# The long soak: 2 minutes of writes by default, `make soak SOAK_SECONDS=1800` for half an hour.
SOAK_SECONDS ?= 120
soak: setup
	PGTRICKLE_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest -m soak tests/integration/test_soak.py $(PYTEST_ARGS)

# The stress, fault-injection and property tests at length: 60 s of concurrent writers, 50 SIGKILLs
# of the daemon, ten times the hypothesis examples.
stress: setup
	PGTRICKLE_STRESS_SECONDS=60 PGTRICKLE_CRASH_KILLS=50 PGTRICKLE_HYPOTHESIS_PROFILE=thorough \
		$(PY) -m pytest -m stress tests $(PYTEST_ARGS)

# Static checks, all of which must pass (CI runs this before the tests): formatting, lint, types and the
# import layering of docs/ARCHITECTURE.md ("Layers"). PYTHONPATH=src: check this tree, not an installed copy.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check src tests benchmarks
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
