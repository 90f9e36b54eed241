#!/usr/bin/env bash
# The first-GPU-run checklist in one command (docs/gpu.md), for a machine with a GPU and no
# network: installs attn-mt into the Python that has torch (pip install --no-deps -e .), then
# runs scripts/gpu_check.py, which writes one report (runs/gpu_check/gpu_check.md by default)
# in under 30 minutes. On a machine without a GPU it runs the CPU-side checks and exits 0.
#
#   bash scripts/gpu_check.sh [--out DIR] [--minutes M] [--cpu-only] [--only WORD ...]
#   PYTHON=/path/to/python bash scripts/gpu_check.sh
# Without PYTHON: the python3 on PATH if it has torch, else the repository's .venv (make setup).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    PYTHON=$(command -v python3 || command -v python)
    if ! "$PYTHON" -c "import torch" 2>/dev/null && [ -x .venv/bin/python ]; then
        PYTHON=.venv/bin/python
    fi
fi

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "gpu_check: $PYTHON has no torch; set PYTHON to the Python that has it" >&2
    exit 2
fi
missing=$("$PYTHON" - <<'PY'
import importlib.util
names = ["numpy", "sentencepiece", "sacrebleu", "typer", "yaml", "tensorboard", "matplotlib", "rich"]
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
    echo "gpu_check: $PYTHON lacks attn-mt's dependencies: $missing (pip install them first)" >&2
    exit 2
fi
if ! "$PYTHON" -c "import attn_mt.cli" 2>/dev/null || ! "$PYTHON" -m attn_mt --version >/dev/null 2>&1; then
    echo "gpu_check: installing attn-mt (pip install --no-deps -e .)"
    "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e .
fi
# Multi30k: $ATTN_MT_DATA if set, else a shared/data folder beside or above the checkout.
if [ -z "${ATTN_MT_DATA:-}" ]; then
    for dir in shared/data ../shared/data; do
        if [ -d "$dir/multi30k" ]; then export ATTN_MT_DATA="$PWD/$dir"; break; fi
    done
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
