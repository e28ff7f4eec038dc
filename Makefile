# replab: every target bootstraps .venv from requirements.lock on first use, so on a fresh machine with
# Python 3.11, Java 17 and make, `make demo` and `make test` are the whole set-up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Delta's jars are resolved from Maven Central once and kept here; later runs start offline.
export REPLAB_JARS_DIR ?= $(CURDIR)/.cache/jars
# numba's compiled kernels are cached here (first call compiles, later processes load).
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba
export PYSPARK_PYTHON := $(CURDIR)/$(PY)
export SPARK_LOCAL_IP ?= 127.0.0.1
export GX_ANALYTICS_ENABLED := false
export MLFLOW_ENABLE_TELEMETRY := false
export DO_NOT_TRACK := true

.PHONY: demo test test-slow bench lint fmt dist lock clean venv testbed browser docs

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/replab demo

# The suite on two xdist workers (a test file is one unit of work, tests/conftest.py) and, beside it, the
# testbed's fast case: a real Kafka cluster on a 60-second timeline that needs about half a core, so it runs at
# normal priority and the suite's processes at nice 10 take what it leaves.
# Its output follows the suite's; either failing fails `make test`.
TEST_WORKERS ?= 2
TESTBED_LOG := .cache/test-testbed.log
test: $(STAMP)
	@mkdir -p .cache
	$(PY) -m pytest -q -m "testbed and not slow" $(PYTEST_ARGS) > $(TESTBED_LOG) 2>&1 & testbed=$$!; \
	nice -n 10 $(PY) -m pytest -q -m "not slow and not testbed" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); \
	suite=$$?; wait $$testbed; testbed_rc=$$?; \
	echo "---- the testbed's fast case (run beside the suite; exit $$testbed_rc) ----"; cat $(TESTBED_LOG); \
	test $$suite -eq 0 && test $$testbed_rc -eq 0

test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow and not testbed" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "slow and testbed" $(PYTEST_ARGS)

# SPEC §12: every scenario of pipelines/testbed_job.py's SUITE (testbed-* on a real Kafka cluster, testbed-rmq-* on a
# real RocketMQ one; root, Java, Maven on the first run), then the README's agreement table. About 4 minutes per
# scenario on two cores.
testbed: $(STAMP)
	$(PY) -m pipelines.testbed_job $(TESTBED_ARGS)

# Headless Chromium from Debian's packages, for the tests that open the reports and the MLflow UI in a real
# browser (tests/report/test_browser.py; skipped without it). Does nothing when it is there, or without root.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; { apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; } && echo "chromium installed"; \
	  else echo "chromium missing: install Debian's chromium package as root (apt-get install chromium)"; fi; }

bench: $(STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)

# The documentation site (MkDocs, Material theme), warnings as errors; tests/docs/test_site.py builds it too.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d .cache/site

# `ruff check` only: the code is wrapped by hand at 120 columns (tables of events, aligned rows), which
# `ruff format` would undo, so the formatter is not part of the contract.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .

# What spark-submit --py-files needs: one zip of the packages (SPEC §6.2), plus a wheel.
dist: $(STAMP)
	$(PY) -m pipelines.dist --out dist

# Regenerate the lock from the top-level pins (in a scratch venv, so the lock is exactly what installs).
lock:
	rm -rf .cache/lockvenv && $(PYTHON) -m venv .cache/lockvenv
	.cache/lockvenv/bin/pip install --quiet --upgrade "pip>=24"
	.cache/lockvenv/bin/pip install --quiet -r requirements.txt -r requirements-dev.txt
	(echo '# Full lock of the tested environment (pip freeze). Regenerate with `make lock`.'; \
	 .cache/lockvenv/bin/pip freeze --exclude-editable | grep -v -iE '^(pip|setuptools|wheel)==') > requirements.lock

clean:
	rm -rf $(VENV) .cache lakehouse mlruns mlflow.db demo dist build *.egg-info .pytest_cache .hypothesis
