# Two commands do everything on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
TORCH  ?= torch==2.13.0
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/multi30k_de_en.yaml
ARGS   ?=  # more `attn-mt train` options, e.g. ARGS='--set train.max_minutes=3'

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
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python scripts/bench_train.py --quick
