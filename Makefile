# Everything a new user runs. `make test` builds .venv from nothing and runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.13.0 CPU build: a local wheel directory when the machine has one, never a CUDA build.
WHEELS := $(wildcard /opt/wheels)
FIND_LINKS := $(if $(WHEELS),--find-links $(WHEELS),--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple)

.PHONY: install test lint bench-tensor bench-engine bench-peers bench-compare bench-quick serve clean

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(FIND_LINKS) torch==2.13.0
	$(BIN)/python -m pip install -q $(FIND_LINKS) -e '.[test]'
	PYTHON=$(BIN)/python bash tools/fetch_perf_analyzer.sh $(VENV)/perf_analyzer \
	  || echo "perf_analyzer was not fetched: tests/e2e/test_perf_analyzer.py is skipped"
	touch $@

install: $(BIN)/.installed

test: $(BIN)/.installed
	$(BIN)/python -m pytest

# Static checks: ruff (undefined names, syntax) and mypy --strict on the package.
$(BIN)/.lint: $(BIN)/.installed
	$(BIN)/python -m pip install -q $(FIND_LINKS) -e '.[test,lint]'
	touch $@

lint: $(BIN)/.lint
	$(BIN)/ruff check --select F,E9 src tests bench tools deploy
	$(BIN)/mypy

bench-tensor: $(BIN)/.installed
	$(BIN)/python bench/tensor_bench.py

bench-engine: $(BIN)/.installed
	$(BIN)/python bench/engine_bench.py --switch-interval 0.0005

# Peers (Triton's Python backend, MLServer, LitServe, FastAPI) each in bench/peers/.venvs/,
# then the side-by-side run; bench-quick is the under-two-minute smoke version.
bench-peers:
	bash bench/peers/install.sh

$(BIN)/.bench: $(BIN)/.installed
	$(BIN)/python -m pip install -q $(FIND_LINKS) -e '.[test,bench]'
	touch $@

bench-compare: $(BIN)/.bench
	$(BIN)/python bench/compare.py

bench-quick: $(BIN)/.bench
	$(BIN)/python bench/compare.py --quick

serve: $(BIN)/.installed
	$(BIN)/tensorgate serve

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
