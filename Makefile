# Tidegate developer entry points. `make run` and `make test` are the README quick start.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# spark: the tiering jobs and their tests (local[2]) need pyspark and a Java runtime.
EXTRAS ?= server,postgres,spark,bench,dev

.PHONY: setup run test lint format typecheck proto proto-check pytest bench bench-smoke fuzz prereqs clean

$(STAMP): pyproject.toml scripts/prereqs.sh
	@sh scripts/prereqs.sh python
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	@touch $(STAMP)

setup: $(STAMP)

## Run a gateway on embedded defaults (data in ./tidegate-data, disk hot tier, SQLite).
run: setup
	$(VENV)/bin/tidegate serve

## Everything CI checks: lint, types, generated stubs, then the whole test suite.
test: setup
	@sh scripts/prereqs.sh test
	$(MAKE) --no-print-directory lint typecheck proto-check pytest

pytest: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache --no-logo

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup
	$(VENV)/bin/mypy

proto: setup
	$(PY) scripts/gen_proto.py

proto-check: setup
	$(PY) scripts/gen_proto.py --check

## The long fuzz run of both edges (10,000 examples per part; CI runs 60): see
## tests/hostile/test_fuzz.py. Prints the requests sent per edge.
fuzz: setup
	TIDEGATE_FUZZ_EXAMPLES=$${TIDEGATE_FUZZ_EXAMPLES:-10000} $(PY) -m pytest -p no:cacheprovider -q -s --timeout 0 tests/hostile/test_fuzz.py

## The quick benchmark suite (< 5 min): results in benchmarks/results/.
bench: setup
	$(PY) -m benchmarks --mode quick

bench-smoke: setup
	$(PY) -m benchmarks --mode smoke

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
