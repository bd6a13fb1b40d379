# LACE developer targets. `make` alone lists them.
# Every target that needs Python sets up the virtual environment first (idempotent).

PYTHON    ?= python3.11
LACE_VENV ?= .venv
PY        := $(LACE_VENV)/bin/python
STAMP     := $(LACE_VENV)/.lace-installed
TEST_WORKERS ?= 2
# the suite on TEST_WORKERS processes, each given whole files (module fixtures stay in one process; docs/testing.md),
# and the 30 slowest steps (setup, call, teardown) named at the end of the log
PYTEST_ARGS ?= -n $(TEST_WORKERS) --dist loadfile --durations=30
BENCH_ARGS  ?= --n 100000
# Bytecode for every Python process a target starts (the suite starts ~hundreds of `lace serve`, workers and `lace`
# commands): with PYTHONDONTWRITEBYTECODE set (as on CI's machine) each process compiled LACE's modules from source,
# 16 % of a `lace serve` start's CPU. The cache lives in the venv (PYTHONPYCACHEPREFIX), never in the checkout.
export PYTHONPYCACHEPREFIX ?= $(abspath $(LACE_VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE
# LACE's packages (pyproject.toml's [tool.setuptools.packages.find]), byte-compiled by `make venv`
PACKAGES  := engine archive service migrations cli stream
# make test-pure (issue 45): the engine's fast tests (oracle, properties, patterns) on the pure-Python modules, in a
# copy of the checkout's files without the compiled extensions (git ls-files: *.so are ignored), on TEST_WORKERS
PURE_DIR   ?= $(abspath build/pure)
# (the matcher against the oracle; not the oracle's own tests, the parser's or the planner's 20 s property test)
PURE_TESTS ?= tests/engine/test_property_matcher.py tests/engine/test_property_intervals.py \
              tests/engine/test_seed_examples.py tests/engine/test_pickles.py \
              --deselect tests/engine/test_property_matcher.py::test_conjunct_reordering_and_push_down_never_change_the_result \
              --deselect tests/engine/test_property_matcher.py::test_parser_reads_the_generated_text_as_the_generated_tree

.DEFAULT_GOAL := help
.PHONY: help venv delta-jars spark-cds postgres test test-pure test-fast demo serve bench bench-service lint check-java clean

help:  ## list the targets
	@echo "LACE make targets:"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  %-11s %s\n", $$1, $$2 }'

venv: $(STAMP)  ## create .venv (Python 3.11; LACE_VENV=dir to move it) and install LACE with dev extras
	@# bytecode of LACE's own packages beside their sources (__pycache__, git-ignored), as pip writes it for installed
	@# packages: a process started outside make (`.venv/bin/lace match` by hand, with PYTHONDONTWRITEBYTECODE set as on
	@# this machine and CI's) compiled about 75 modules from source, 0.1 CPU s of every `lace` command (issue 45);
	@# compileall writes even when PYTHONDONTWRITEBYTECODE is set, skips what is current (0.06 s) and, without the
	@# make-wide PYTHONPYCACHEPREFIX, writes beside the sources, where a process outside make looks
	@env -u PYTHONPYCACHEPREFIX $(PY) -m compileall -q $(PACKAGES)

# Reinstall when pyproject.toml changes, a top-level package appears (editable installs map packages at install time)
# or a module of the compiled engine changes (its C extension, not the .py beside it, is what Python imports).
ENGINE_COMPILED := $(shell $(PYTHON) -c "import runpy; print(' '.join(m.replace('.', '/') + '.py' for m in runpy.run_path('engine/build.py')['COMPILED']))" 2>/dev/null)
$(STAMP): pyproject.toml setup.py engine/build.py tests/plugin_pkg/pyproject.toml $(wildcard */__init__.py) $(ENGINE_COMPILED)
	@if [ ! -x "$(PY)" ]; then \
	  command -v $(PYTHON) >/dev/null 2>&1 || { echo "Python 3.11 is required ($(PYTHON) not found on PATH)" >&2; exit 1; }; \
	  echo "creating $(LACE_VENV) with $(PYTHON)"; \
	  $(PYTHON) -m venv $(LACE_VENV); \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# the test plug-in package (issue 16): registers entry points that tests/engine/test_plugins.py uses
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e tests/plugin_pkg
	@$(PY) -c 'from engine.build import engine_build as b; print("make venv: engine", b())'
	@touch $@

# The Delta Spark connector (io.delta JARs for the pinned pyspark and delta-spark) fetched by mvn into .jars/, once.
# Without Maven or network this warns and LACE reads the archive with its filelist reader; under CI it must succeed.
delta-jars:  ## fetch the Delta Spark connector with Maven into .jars/ (skipped when present)
	@$(PYTHON) deploy/fetch_delta_jars.py $(if $(CI),,--optional) >/dev/null

# The Spark driver's class-data-sharing archive in the venv (archive/class_archive.py): every later driver JVM starts
# in about a third of the CPU. Written once per venv; a failure only warns (Spark starts without it).
spark-cds: check-java venv delta-jars  ## write the Spark driver's class archive into the venv (skipped when present)
	@$(PY) -m archive.class_archive || true

postgres:  ## install (apt-get, root) and start PostgreSQL for the tests: 127.0.0.1:5432, trust, database test
	bash .ci/postgres.sh

test: check-java venv delta-jars spark-cds  ## run the whole test suite, slow tests included (then the pure-Python engine's)
	@# CI runs the compiled build (issue 45): a venv whose mypyc build fell back to pure Python (pip's --quiet hides why)
	@# fails here rather than running the suite on the slower modules
	@if [ -n "$$CI" ]; then $(PY) -c 'import sys; from engine.build import engine_build as b; s = b(); \
	  sys.exit(0 if s.startswith("compiled") else f"make test: the engine is {s}, not compiled; reinstall with \
	  pip install -v -e . to see why")'; fi
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-pure

test-pure: venv  ## the engine's oracle/property/pattern tests on the pure-Python modules (not the compiled build)
	@rm -rf $(PURE_DIR) && mkdir -p $(PURE_DIR)
	@git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null \
	  | tar -xf - -C $(PURE_DIR)
	@cd $(PURE_DIR) && $(abspath $(PY)) -c 'from engine.build import engine_build as b; \
	  assert b() == "pure Python", b(); print("make test-pure: engine", b(), "from", __import__("engine").__file__)'
	cd $(PURE_DIR) && $(abspath $(PY)) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) $(PURE_TESTS)

test-fast: check-java venv delta-jars spark-cds  ## run the tests not marked slow
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: check-java venv delta-jars spark-cds  ## run the main job (lace demo)
	$(LACE_VENV)/bin/lace demo

serve: venv delta-jars spark-cds  ## run the REST service (lace serve; settings from LACE_* variables)
	$(LACE_VENV)/bin/lace serve

bench-service: venv  ## service benchmark: ingest events/s and ingest-to-webhook latency
	$(PY) -m bench.service

bench: venv  ## run the benchmarks (BENCH_ARGS=... to change the stream)
ifneq ($(wildcard bench/run.py),)
	$(PY) -m bench.run $(BENCH_ARGS)
else
	$(PY) -m bench.streams $(BENCH_ARGS)
endif

lint: venv  ## ruff and mypy
	$(LACE_VENV)/bin/ruff check .
	$(LACE_VENV)/bin/mypy $(wildcard engine service archive cli)

check-java:  ## fail unless java is on PATH (needed by Spark targets)
	@command -v java >/dev/null 2>&1 || { echo "Java 17 is required (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }

clean:  ## remove caches (keeps the venv)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis bench/.cache build *.egg-info
	find . -path ./$(LACE_VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
