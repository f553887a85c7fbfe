# Tidegate developer entry points. `make run` and `make test` are the README quick start.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Everything: what `make test` and the other developer targets need.
# spark: the tiering jobs and their tests (local[2]) need pyspark and a Java runtime.
EXTRAS ?= server,postgres,spark,bench,dev
# What `make run` needs: the gateway alone. Its embedded defaults tier with the local
# runner (threads in the gateway), so neither pyspark nor Java is needed to serve.
RUN_EXTRAS ?= server
# One virtualenv, two stamps: `make run` installs RUN_EXTRAS, `make test` adds the rest, in
# either order. A full install also satisfies `make run`, so it touches both stamps.
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

# The Spark connector's jar (gateway/spark/jvm), carried by the wheel: gateway.spark.jar_path().
JAR := gateway/spark/jars/tidegate-spark.jar
JVM_SOURCES := $(shell find gateway/spark/jvm/src -type f 2>/dev/null)

.PHONY: setup run test test-cache jar lint format typecheck proto proto-check pytest dist wheelhouse bench bench-smoke profile fuzz faults soak attacks prereqs clean

# $(call install,extras,what it is for): create the virtualenv if needed and install tidegate
# (editable) with those extras, saying what and why first and showing pip's progress (no
# --quiet: a first install takes a while). No commas in the arguments: make splits on them.
define install
	@sh scripts/prereqs.sh python
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo "tidegate: installing tidegate[$(1)] into $(VENV) for $(2)."
	$(PY) -m pip install -e '.[$(1)]'
endef

$(STAMP): pyproject.toml scripts/prereqs.sh
	$(call install,$(EXTRAS),the tests and every developer target: about 2.2 GB and a few minutes the first time)
	@touch $(STAMP) $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml scripts/prereqs.sh
	$(call install,$(RUN_EXTRAS),serving: about 470 MB and a minute the first time (make test adds the developer tools and Spark))
	@touch $(RUN_STAMP)

setup: $(STAMP)

## Run a gateway on embedded defaults (data in ./tidegate-data, disk hot tier, SQLite).
run: $(RUN_STAMP)
	$(VENV)/bin/tidegate serve

# pytest-xdist workers of `make pytest` (and so of `make test`): 4 on 2 cores, measured (most
# tests wait on processes and I/O): docs/decisions/test-suite.md. PYTEST_WORKERS=0 runs the
# tests in one process, one after another (as plain `.venv/bin/python -m pytest` does).
PYTEST_WORKERS ?= 4

## The JVM connector's jar, compiled against the installed pyspark's own jars (no Maven:
## offline, a few seconds). `make run` does not need it; test, bench and dist build it.
jar: $(JAR)

$(JAR): $(JVM_SOURCES) | $(STAMP)
	@sh scripts/prereqs.sh jdk
	@rm -rf build/jvm && mkdir -p build/jvm/classes $(dir $(JAR))
	javac --release 17 -Xlint:all,-path,-classfile -Werror -d build/jvm/classes \
	  -cp "$$($(PY) -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/jars/*" \
	  $(filter %.java,$(JVM_SOURCES))
	cp -R gateway/spark/jvm/src/main/resources/. build/jvm/classes/
	jar --create --file $@ -C build/jvm/classes .

## Everything CI checks: lint, types, generated stubs, then the whole test suite.
test: setup jar
	@sh scripts/prereqs.sh test
	$(MAKE) --no-print-directory -j4 --output-sync=target lint typecheck proto-check wheelhouse test-cache
	$(MAKE) --no-print-directory pytest

# pytest's rewritten test modules, cached beside them once (pytest writes them only where
# bytecode may be written, and this machine's environment may say it may not): each
# pytest-xdist worker then collects in about 4 s instead of rewriting every assert of the
# suite again (11 s of CPU each). Runs beside the checks of `make test`.
test-cache: setup
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest --collect-only -q -p no:cacheprovider > /dev/null

# --dist loadgroup: tests of one xdist group (tests/conftest.py) run on one worker.
# The checkout's bytecode is compiled once first: the suite starts some 500 Python
# processes (gateways, CLI commands, workers), and where PYTHONDONTWRITEBYTECODE is set
# each would compile every module it imports again (Python still reads a .pyc it finds).
pytest: setup wheelhouse jar
	PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q -j 0 gateway tiering tests benchmarks > /dev/null
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

## The wheel and the sdist of tidegate, in $(DIST)/, built with the virtualenv's own
## setuptools (no download). `pip install dist/tidegate-*.whl` installs the package and
## its `tidegate` command anywhere (README, "Install from a wheel").
DIST ?= dist
dist: setup jar
	rm -f $(DIST)/tidegate-*.whl $(DIST)/tidegate-*.tar.gz
	$(PY) -m build --no-isolation --outdir $(DIST) .

## The wheels of everything `tidegate[server]` needs, kept in the virtualenv, so that the
## test of the built wheel (tests/test_package.py) installs it into a fresh virtualenv
## without the network. Made once (pip's cache serves the downloads), again when
## pyproject.toml changes.
WHEELHOUSE := $(VENV)/wheelhouse
$(WHEELHOUSE)/.made: pyproject.toml | $(STAMP)
	$(PY) -m pip wheel --quiet --no-build-isolation --wheel-dir $(WHEELHOUSE) '.[server]'
	rm -f $(WHEELHOUSE)/tidegate-*.whl
	@touch $@

wheelhouse: setup $(WHEELHOUSE)/.made

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache --no-logo

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# mypy's cache outside the checkout, as pip's is: a fresh clone checks in about a second
# what took 20 (it trusts a cached module only when its source's hash matches).
MYPY_CACHE ?= $(HOME)/.cache/tidegate/mypy
typecheck: setup
	$(VENV)/bin/mypy --cache-dir "$(MYPY_CACHE)"

proto: setup
	$(PY) scripts/gen_proto.py

proto-check: setup
	$(PY) scripts/gen_proto.py --check

## The long fuzz run of both edges (10,000 examples per part; CI runs 60): see
## tests/hostile/test_fuzz.py. Prints the requests sent per edge. Then every conversion of
## values into Arrow over 5,000 edge values per column type, in a child process
## (tests/hostile/conversions.py; CI runs 60).
fuzz: setup
	TIDEGATE_FUZZ_EXAMPLES=$${TIDEGATE_FUZZ_EXAMPLES:-10000} \
	TIDEGATE_CONVERSION_EXAMPLES=$${TIDEGATE_CONVERSION_EXAMPLES:-5000} \
	$(PY) -m pytest -p no:cacheprovider -q -s --timeout 0 tests/hostile/test_fuzz.py \
	  tests/hostile/test_conversions.py

## The fault suite (tests/faults, docs/durability.md): SEEDS seeds from FIRST (default 4
## from 1; `make faults SEEDS=200` is the long run), or one seed alone (`make faults SEED=17`).
## Each seed: a cluster under seeded faults, a recorded history, a checker over both tiers.
## FAULTS_ARGS=--spark reads every seed back through the Spark connector as well.
SEEDS ?= 4
FIRST ?= 1
faults: setup
	$(PY) -m tests.faults $(strip $(if $(SEED),--seed $(SEED),--seeds $(SEEDS) --first $(FIRST)) $(FAULTS_ARGS))

## Ten minutes of a bounded mixed workload: RSS, open files and latency of the gateways
## over time, plotted against the memory budget (benchmarks/results/soak/).
SOAK_MINUTES ?= 10
soak: setup
	$(PY) -m tests.faults.soak --minutes $(SOAK_MINUTES) --out benchmarks/results/soak

## The full-size attacks of issue 33 (a 1.5 GB body without a key, 60 x 60 MiB gRPC
## appends, 21,000 bare connections, 400 slow clients, idle append streams, a tenant at
## 1,350 appends/s over its quota) on a gateway of their own, measured from /proc:
## benchmarks/results/attacks/. ATTACKS=body,grpc picks some; ROOT=<checkout> runs
## another checkout's gateway (the figures before).
ATTACKS ?= body,grpc,bare,slow,streams,reject
attacks: setup
	$(PY) -m benchmarks.attacks --only $(ATTACKS) $(if $(ROOT),--root $(ROOT) --label $(or $(LABEL),before),--label $(or $(LABEL),after))

## The quick benchmark suite (< 5 min), then the scale benchmark's quick mode (16 min on 2 cores): results in benchmarks/results/.
bench: setup jar
	$(PY) -m benchmarks --mode quick
	$(PY) -m benchmarks.scale --mode quick

bench-smoke: setup jar
	$(PY) -m benchmarks --mode smoke
	$(PY) -m benchmarks.profile hot-read --seconds 1

## Where a gateway spends its time on each hot path (py-spy), summaries and samples in
## benchmarks/results/profiles/.
profile: setup
	$(PY) -m benchmarks.profile hot-read cold-read scan append --out benchmarks/results/profiles

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build $(DIST)
