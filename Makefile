# The README's two commands: `make demo` runs the main job, `make test` the tests.
# Each creates and fills the virtual environment on a fresh machine. `make test`
# (and `make chaos`) also install the system packages the suite needs
# (scripts/ci-deps.sh, as root) and start PostgreSQL, Redis and RabbitMQ when they
# are down (scripts/services.sh); not root, each says in one line what is missing.
# `make demo` needs neither: it runs on the embedded SQLite default.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVICES ?= postgres redis rabbitmq

.PHONY: demo test deps services lint chaos chaos-long chaos-partitions bench fuzz dashboard-snapshot clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# `make demo DEMO_FLAGS=--serve` also runs the operator console (its URL and a key are printed)
# and leaves two approvals and an operation of unknown outcome in it for you to decide.
DEMO_FLAGS ?=

demo: $(STAMP)
	$(BIN)/toolfence demo $(DEMO_FLAGS)

deps:
	sh scripts/ci-deps.sh

services: deps
	bash scripts/services.sh $(SERVICES)

test: deps services $(STAMP)
	$(BIN)/python -m compileall -q executor outbox reconciler ledger tests > /dev/null
	bash scripts/test-tiers.sh $(BIN)/python

chaos: deps services $(STAMP)
	$(BIN)/python -m pytest -q -m chaos tests/chaos

chaos-long: $(STAMP)
	$(BIN)/python -m tests.chaos.campaign --minutes 30 --report bench/CHAOS.md

# Root: every node in a network namespace; partitions, loss, delay, reordering,
# duplication and clock skew with the process faults (tests/chaos/partitions.py).
# Writes bench/PARTITIONS.md and bench/PARTITIONS.png. PARTITIONS_MINUTES=5 for a short one.
PARTITIONS_MINUTES ?= 30
chaos-partitions: deps $(STAMP)
	$(BIN)/python -m tests.chaos.partitions --minutes $(PARTITIONS_MINUTES) --report bench/PARTITIONS.md

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.cli_startup
	$(BIN)/python -m bench.serve
	$(BIN)/python -m bench.entrance

# Coverage-guided fuzzing (atheris) of every entry point for FUZZ_SECONDS each, one
# after another (17 targets: about 17 x FUZZ_SECONDS in all), the hosted path and
# `toolfence serve` included; writes bench/FUZZ.md. Needs PostgreSQL.
# `python -m bench.fuzz.run --targets a,b` runs some of them (--help lists them).
FUZZ_SECONDS ?= 80
fuzz: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,fuzz]'
	$(BIN)/python -m bench.fuzz.run --seconds-per-target $(FUZZ_SECONDS) --report bench/FUZZ.md

# docs/dashboard.png: the Grafana dashboard's queries, answered by a real Prometheus
# that scraped `toolfence demo` (scripts/dashboard_snapshot.py; about a minute).
dashboard-snapshot: deps $(STAMP)
	$(BIN)/pip install --quiet 'matplotlib>=3.8'
	$(BIN)/python scripts/dashboard_snapshot.py --out docs/dashboard.png

lint: $(STAMP)
	$(BIN)/ruff check executor outbox reconciler ledger tests bench
	$(BIN)/mypy executor outbox reconciler ledger

clean:
	rm -rf $(VENV) .toolfence
