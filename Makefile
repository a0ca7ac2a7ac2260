# Developer entry points. Everything runs from the project's own virtualenv in .venv, created and kept
# up to date here, so `make run` and `make test` work on a fresh clone with only python3 (3.11) present.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Written after a successful install; pyproject.toml being newer triggers a reinstall.
STAMP  := $(VENV)/.chatexport-installed

.DEFAULT_GOAL := help
.PHONY: help install lock prerequisites run test test-quick test-clusters test-upgrade pytest lint fmt typecheck docs bench bench-http bench-drain bench-export bench-chunks bench-redirect bench-tracing bench-callbacks bench-waiters bench-counts bench-media bench-tokens bench-lines chaos clusters replay-standby-conflicts screenshots clean

# A stamp alone would not notice a venv whose project was uninstalled or that a failed install left
# half-done: in that case force the install target to run.
ifneq ($(shell $(BIN)/python -c "import importlib.metadata as m; m.distribution('chatexport')" 2>/dev/null && echo ok),ok)
.PHONY: $(STAMP)
endif

help:
	@echo "make run        start every part locally with moto and demo data (chatexport dev)"
	@echo "make test       lint, format check, type check and every test but the cluster and upgrade groups"
	@echo "make test-quick the fast loop: lint, format check, type check and the tests that start no server"
	@echo "make test-clusters  the tests on local RabbitMQ and PostgreSQL clusters (marked cluster)"
	@echo "make test-upgrade   the previous release beside this one, live (marked upgrade)"
	@echo "make lint       ruff check + ruff format --check + mypy"
	@echo "make docs       build the documentation site into site/, every warning an error"
	@echo "make fmt        ruff format + ruff check --fix"
	@echo "make bench      the benchmarks: polls, submits, the drain and latency beside a bare pipeline, the"
	@echo "                1M-message export, recovery, downloads by redirect, chunked exports, tracing's cost,"
	@echo "                callbacks, waiters, counts per export, an export with media, the read of an export's"
	@echo "                lines (make bench-http, -drain, -export, -redirect, -chunks, -tracing, -callbacks,"
	@echo "                -waiters, -counts, -media, -tokens, -lines run one)"
	@echo "make chaos      the fault harness: ROUNDS=1000 rounds of random faults, SEED=S (default random),"
	@echo "                ROUND=K replays one, LANES=2 runs rounds on two systems at once, CLUSTER=1 on a"
	@echo "                RabbitMQ cluster and a PostgreSQL primary with standbys (node kills, failovers)"
	@echo "make clusters   start a 3-node RabbitMQ cluster and a PostgreSQL primary with a standby, print the"
	@echo "                CHATEXPORT_* URLs that point at them, delete both on Ctrl-C"
	@echo "make screenshots  the web page's pictures in docs/, from a running system and headless chromium"
	@echo "make replay-standby-conflicts  EXPORTS=20 exports of 1M messages read on a standby kept in conflict"
	@echo "make install    create $(VENV) and install the locked dependencies (requirements/dev.lock), then the project"
	@echo "make lock       resolve pyproject.toml's dependencies again into requirements/*.lock (minutes)"
	@echo "make prerequisites  check that this host has the programs the tests run (make test does first)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Exactly the locked versions, each checked against its hash, then the project itself without resolving
# anything more (docs/development.md: Dependencies).
$(STAMP): pyproject.toml requirements/dev.lock | $(BIN)/python
	$(BIN)/python -m pip install --disable-pip-version-check --require-hashes -r requirements/dev.lock
	$(BIN)/python -m pip install --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

# One resolution for everything (aiobotocore pins botocore, and moto and boto3 must agree with it): the
# runtime lock first, then the development lock constrained by it. Takes minutes: pip-tools asks the index
# about every package.
lock: install
	$(BIN)/python -m pip install --disable-pip-version-check -q "pip-tools>=7.4,<8"
	$(BIN)/pip-compile -q --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
		--upgrade -o requirements/runtime.lock pyproject.toml
	$(BIN)/pip-compile -q --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
		--upgrade --extra dev --extra demo -c requirements/runtime.lock -o requirements/dev.lock pyproject.toml

install: $(STAMP)

run: install
	$(BIN)/chatexport dev

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy chatexport devtools shared services tests bench
	$(BIN)/python -m devtools.migration_lint

typecheck: install
	$(BIN)/mypy chatexport devtools shared services tests bench

# MkDocs 1.x and its plugins print notices about their own future on every build; they are not warnings
# about this site, and --strict still fails the build on any real one.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
docs: install
	$(DOCS_ENV) $(BIN)/mkdocs build --strict --quiet

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The programs the tests run beside Python (a browser, libfaketime, the PostgreSQL and RabbitMQ server
# programs, pg_dump): a host without one is told which package to install before anything runs.
prerequisites: install
	$(BIN)/python -m devtools.prerequisites

# pytest exits 5 when it collected no test: for us that is a failure, never a pass. The tests on local
# clusters (marked `cluster`) start three RabbitMQ nodes and PostgreSQL standbys, and the upgrade tests (marked
# `upgrade`) build and run the previous release: they are groups of their own, `make test-clusters` and `make
# test-upgrade`, which CI runs after `make test`, each with a time limit of its own.
test: prerequisites lint docs
	@$(MAKE) --no-print-directory pytest MARKERS="not cluster and not upgrade"

# Two processes: the tests on the RabbitMQ cluster on one, those on PostgreSQL clusters on the other, each
# group one test at a time, since its tests freeze, kill and time nodes (tests/clusters/conftest.py).
test-clusters: prerequisites
	@$(MAKE) --no-print-directory pytest MARKERS="cluster" WORKERS=2

# The live upgrade from the previous release and back, and the previous release's database tests on this
# schema (docs/deploy.md: Upgrading, The live upgrade test); the first run on a machine also builds that
# release (about a minute).
test-upgrade: prerequisites
	@$(MAKE) --no-print-directory pytest MARKERS="upgrade" WORKERS=1

# The developer's loop, under a minute: what needs no PostgreSQL, RabbitMQ, moto or processes of the system.
test-quick: lint
	@$(MAKE) --no-print-directory pytest MARKERS="not integration and not e2e and not cluster and not upgrade" DURATIONS=10

# Each run ends with its slowest tests: where the time goes (docs/development.md: Where the time goes). The tests
# run on WORKERS processes (pytest-xdist), each test file on one of them, so that a module's fixtures are set up
# once; WORKERS=0 runs them in this process.
MARKERS ?=
DURATIONS ?= 25
WORKERS ?= 4
DIST ?= loadgroup
pytest:
	@status=0; $(BIN)/pytest -m "$(MARKERS)" -n $(WORKERS) --dist $(DIST) --durations=$(DURATIONS) \
		-p devtools.test_times --time-table || status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

# The web page's pictures in docs/ (page.png, page-narrow.png), taken from a running system by headless chromium.
screenshots: prerequisites
	$(BIN)/python -m devtools.screenshots

bench: install
	@command -v wrk >/dev/null || apt-get install -y wrk || sudo apt-get install -y wrk
	$(BIN)/python bench/all.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/redirect.py
	$(BIN)/python bench/chunks.py
	$(BIN)/python bench/counts.py
	$(BIN)/python bench/claim_cost.py
	$(BIN)/python bench/media.py
	$(BIN)/python bench/read_lines.py

# One row of the table each: the polls and submits, the drain beside the bare pipeline, the 1M export.
bench-http: install
	@command -v wrk >/dev/null || apt-get install -y wrk || sudo apt-get install -y wrk
	$(BIN)/python bench/http_load.py

bench-drain: install
	$(BIN)/python bench/drain.py

bench-export: install
	$(BIN)/python bench/export_1m.py

bench-chunks: install
	$(BIN)/python bench/chunks.py

bench-tracing: install
	$(BIN)/python bench/tracing_cost.py

bench-redirect: install
	$(BIN)/python bench/redirect.py

bench-callbacks: install
	$(BIN)/python bench/callbacks.py

bench-waiters: install
	$(BIN)/python bench/waiters.py

bench-counts: install
	$(BIN)/python bench/counts.py

bench-media: install
	$(BIN)/python bench/media.py

bench-lines: install
	$(BIN)/python bench/read_lines.py

bench-tokens: install
	@command -v wrk >/dev/null || apt-get install -y wrk || sudo apt-get install -y wrk
	$(BIN)/python bench/token_keys.py

# The long run of the fault harness; a short fixed-seed sample of it is part of `make test`.
ROUNDS ?= 1000
SEED   ?=
ROUND  ?=
LANES  ?= 1
CLUSTER ?=
chaos: install
	@command -v faketime >/dev/null || (apt-get update -qq && apt-get install -y faketime) || (sudo apt-get update -qq && sudo apt-get install -y faketime)
	$(BIN)/python -m tests.chaos --rounds $(ROUNDS) --lanes $(LANES) $(if $(SEED),--seed $(SEED)) $(if $(ROUND),--round $(ROUND)) $(if $(CLUSTER),--cluster)

clusters: install
	$(BIN)/python -m devtools.clusters

# Exports read on a standby kept in conflict by the primary's churn and VACUUM (docs/development.md:
# Development, Disturbed standby exports): EXPORTS=20 of a 1,000,000-message conversation.
EXPORTS ?= 20
replay-standby-conflicts: install
	$(BIN)/python -m tests.support.standby_conflicts --exports $(EXPORTS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
