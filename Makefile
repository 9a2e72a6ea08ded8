# Every target bootstraps .venv from the project's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint demo bench chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,nats,server,langgraph]'
	touch $(STAMP)

venv: $(STAMP)
	@echo "wakeful is in $(BIN); put it on this shell's PATH with: . $(BIN)/activate"

# Two pytest-xdist workers; the shared-PostgreSQL tests keep to one of them (tests/conftest.py).
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

demo: $(STAMP)
	$(BIN)/python -m wakeful.demo

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,nats,server,langgraph,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The full chaos matrix (>= 500 fault trials); writes docs/reliability.md.
CHAOS_TRIALS ?= 40
chaos: $(STAMP)
	CHAOS_TRIALS=$(CHAOS_TRIALS) CHAOS_JOBS=2 $(BIN)/python -m tests.chaos --report docs/reliability.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
