# Concord: `make demo` and `make test` work on a fresh machine with only Python 3.10+ installed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# pytest workers and per-test timeout can be tuned from the environment: the unit and
# integration tests run on TEST_WORKERS processes (pytest-xdist; 0 runs them in pytest's own)
PYTEST_ARGS ?=
TEST_WORKERS ?= 2

.PHONY: install test-prereqs serve-prereqs bench-prereqs demo docs test test-unit test-integration e2e bench clean serve stop status

install: $(STAMP)

$(STAMP): pyproject.toml
	@echo "Installing Concord and its dependencies into $(VENV) (PyTorch, Prefect, MLflow, ...): this usually takes about 5 minutes, once."
	@echo "pip says what it collects; while it works without a word, a line every 8 s says so."
	@$(PYTHON) tools/heartbeat.py --label "creating $(VENV)" -- $(PYTHON) -m venv $(VENV)
	@$(PYTHON) tools/heartbeat.py --label "upgrading pip" -- $(PIP) install --progress-bar off --upgrade pip
	@$(PYTHON) tools/heartbeat.py --label "installing with pip" -- $(PIP) install --progress-bar off -e '.[dev,demo,bench]'
	@touch $(STAMP)
	@echo "Installed."

demo: install
	CONCORD_HOME=$${CONCORD_HOME:-$(CURDIR)/data/demo} PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) -m demo

# Real servers the tests start that pip cannot install: CNCF distribution (an OCI registry) and
# htpasswd (bcrypt users for it). Installed with apt when root; otherwise a message, and the OCI tests fail.
REGISTRY_BIN := /usr/bin/docker-registry
test-prereqs: serve-prereqs
	@if [ -x $(REGISTRY_BIN) ] && command -v htpasswd >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  (apt-get install -y -q docker-registry apache2-utils || (apt-get update -q && apt-get install -y -q docker-registry apache2-utils)) >/dev/null; \
	else echo "test-prereqs: $(REGISTRY_BIN) or htpasswd is missing and this is not root: run 'sudo apt-get install -y docker-registry apache2-utils' (the OCI tests fail without them)"; fi

# Unit and integration tests in one run (on TEST_WORKERS processes, each with its own moto_server,
# Prefect test harness and mlflow server), the end-to-end tests (one real served instance, one
# process) in another, so no client state of a served instance outlives it into the test harness.
# Each phase says what it runs and how long it took; pytest lists its slowest tests.
test: install test-prereqs
	@bash tests/phase.sh "lint" $(VENV)/bin/ruff check .
	@bash tests/phase.sh "types" $(VENV)/bin/mypy
	@bash tests/phase.sh "import contracts" $(VENV)/bin/lint-imports
	@bash tests/phase.sh "unit and integration tests" $(VENV)/bin/pytest -q --durations=15 -n $(TEST_WORKERS) tests/unit tests/integration $(PYTEST_ARGS)
	@bash tests/phase.sh "end-to-end tests" $(VENV)/bin/pytest -q --durations=10 tests/e2e $(PYTEST_ARGS)

# The API reference: one HTML page of what `import concord` exports, from the docstrings, in build/api
API_DOCS ?= build/api
docs: install
	$(VENV)/bin/pdoc --docformat google -o $(API_DOCS) concord '!concord\..*'
	@echo "API reference: $(API_DOCS)/concord.html"

test-unit: install
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) tests/unit $(PYTEST_ARGS)

test-integration: install test-prereqs
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) tests/integration $(PYTEST_ARGS)

# End to end against a real Prefect server, worker and watcher (about a minute; also part of `make test`)
e2e: install
	$(VENV)/bin/pytest -q tests/e2e -m e2e $(PYTEST_ARGS)

# Run it for real: seeds what the deployments' defaults name (only what is missing), then a Prefect
# server (or $$PREFECT_API_URL), the work pool, blocks, every deployment, a worker and the checkpoint
# watcher, first PostgreSQL (a cluster in data/postgres) and an MLflow server on it; it ends by
# printing the Prefect UI's address and MLflow's. `make stop` ends what `make serve` started, and only that.
serve: install serve-prereqs
	$(PY) -m concord_pipelines.deployments.serve start

# PostgreSQL (Debian's postgresql), which make serve runs the Prefect and MLflow servers on (a
# cluster under data/postgres) and the end-to-end tests serve on. Installed with apt when root, its
# progress shown; otherwise a message, and make serve keeps their data in SQLite.
serve-prereqs:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "serve-prereqs: installing PostgreSQL (apt-get install -y postgresql)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q postgresql || (apt-get update -q && apt-get install -y -q postgresql); \
	else echo "serve-prereqs: PostgreSQL is missing and this is not root: run 'sudo apt-get install -y postgresql' (without it make serve keeps the servers' data in SQLite, which locks under concurrent runs, and the Postgres end-to-end test fails)"; fi

stop:
	@if [ -x $(PY) ]; then $(PY) -m concord_pipelines.deployments.serve stop; else echo "nothing to stop (no $(VENV))"; fi

status:
	$(PY) -m concord_pipelines.deployments.serve status

# The baselines benchmarks time beside Concord that pip cannot install: rsync, b3sum, restic and
# rclone. Installed with apt when root; otherwise a message, and their rows fall back or are left out.
BENCH_TOOLS := rsync b3sum restic rclone
bench-prereqs:
	@missing=""; for t in $(BENCH_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  (apt-get install -y -q $$missing || (apt-get update -q && apt-get install -y -q $$missing)) >/dev/null; \
	else echo "bench-prereqs:$$missing missing and this is not root: run 'sudo apt-get install -y$$missing' (without them those baselines fall back or are left out)"; fi

bench: install bench-prereqs
	$(PY) -m bench

clean:
	rm -rf data bench/out .pytest_cache .hypothesis .import_linter_cache .ruff_cache .mypy_cache
