# Two commands do everything on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
TORCH  ?= torch==2.13.0
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/multi30k_de_en.yaml
# The browser the serve page test drives (tests/helpers/browser.py finds it on PATH).
CHROMIUM ?= chromium
ARGS   ?=  # more `attn-mt train` options, e.g. ARGS='--set train.max_minutes=3'
# The suite runs on every core (up to 4 pytest-xdist workers, one torch thread each where
# cores are few; tests/conftest.py shares them out). TESTFLAGS='-n 0' runs it in one process.
TESTFLAGS ?= -n auto --maxprocesses 4 --dist worksteal --durations=15

.PHONY: setup browser train test lint bench clean

setup: $(VENV)/.installed

# pip's own progress bars (no -q): what is installed and how big (several GB with a CUDA torch).
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup: pip, $(TORCH) (CPU wheel 183 MB, 750 MB installed), attn-mt and dev tools (~1 GB)"
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install --progress-bar on "$(TORCH)"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev]"
	touch $@

# The serve page test drives the system's Chromium (Playwright's browser download needs the
# network). Installed here where this user can (root with apt-get); else one line says what to do.
browser:
	@command -v $(CHROMIUM) >/dev/null || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "browser: installing Chromium for the serve page test (apt-get install chromium)"; \
	    apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "browser: the serve page test needs Chromium: sudo apt-get install -y chromium"; \
	  fi; }

train: setup
	$(BIN)/attn-mt train --config $(CONFIG) $(ARGS)

test: setup browser
	$(BIN)/python -m pytest $(TESTFLAGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python scripts/bench_train.py --quick
