# Two commands do everything on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
TORCH  ?= torch==2.13.0
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/multi30k_de_en.yaml
ARGS   ?=  # more `attn-mt train` options, e.g. ARGS='--set train.max_minutes=3'
# The suite runs on every core (up to 4 pytest-xdist workers, one torch thread each where
# cores are few; tests/conftest.py shares them out). TESTFLAGS='-n 0' runs it in one process.
TESTFLAGS ?= -n auto --maxprocesses 4 --dist worksteal

.PHONY: setup train test lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

train: setup
	$(BIN)/attn-mt train --config $(CONFIG) $(ARGS)

test: setup
	$(BIN)/python -m pytest $(TESTFLAGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python scripts/bench_train.py --quick
