"""Decoding speed of model shapes with random weights, every sentence decoded to its source
length: how the student presets were sized.

    python scripts/bench_shapes.py --model runs/multi30k_de_en \
        --shape teacher=256,4,3,3,1024 --shape student=256,4,6,1,1024

The code, what it measures and its options (`--help`): bench/shapes.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.shapes import main  # noqa: E402

if __name__ == "__main__":
    main()
