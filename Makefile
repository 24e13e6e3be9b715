# The README's two commands: `make demo` runs the main job, `make test` the tests.
# Each creates and fills the virtual environment on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint chaos chaos-long bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolfence demo

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

chaos: $(STAMP)
	$(BIN)/python -m pytest -q -m chaos tests/chaos

chaos-long: $(STAMP)
	$(BIN)/python -m tests.chaos.campaign --minutes 30 --report bench/CHAOS.md

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m bench.run

lint: $(STAMP)
	$(BIN)/ruff check executor outbox reconciler ledger tests bench
	$(BIN)/mypy executor outbox reconciler ledger

clean:
	rm -rf $(VENV) .toolfence
