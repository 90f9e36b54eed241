"""Decoding speed and memory: attn-mt against CTranslate2 on the same weights, every row in a
process of its own.

    python scripts/bench_decode.py --model runs/multi30k_de_en --quick

The code, what it measures and its options (`--help`): bench/decode.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.decode import main  # noqa: E402

if __name__ == "__main__":
    main()
